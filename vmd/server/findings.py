"""What a `vmd doctor` check answers: a status and a sentence (vmd/server/doctor.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# ok; warn: works, but worse than it could (TCG, no eyes for the model); wait: not yet (an
# image being built); fail.
Status = Literal["ok", "warn", "wait", "fail"]
# Every server the doctor asks answers on a LAN at most: ten seconds is a server that is not there.
HTTP_TIMEOUT_S = 10.0


@dataclass
class Finding:
    check: str
    status: Status
    text: str

    def line(self) -> str:
        mark = {"ok": "ok  ", "warn": "warn", "wait": "wait", "fail": "FAIL"}[self.status]
        return f"[{mark}] {self.check:9} {self.text}"


def one_line(text: str) -> str:
    return " ".join(text.split())
