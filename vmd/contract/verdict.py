"""vmd's verdict on the agent's check, and its words: part of the contract.

Every place that says how a session's check went (the finish's answer, the report, the
commit message, the Gitea status, the job's end, the eval's table, the CLI's exit code)
reads one `Verdict` and words it through `label`, `reason` and `sentence` here, so that
"verified and proven" means the same thing everywhere. Pure pydantic, like the whole
contract.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

__all__ = ["Verdict", "VerdictStatus"]

# The report outcome's `status` (vmd/session/report.py): the verdict as one word on the wire.
VerdictStatus = Literal["passed", "passed_not_proven", "failed", "unverified"]


class Verdict(BaseModel):
    """How vmd's own runs of the agent's check went.

    passed: the check passed when vmd ran it (None: the session never got a verdict).
    proven: the check also failed on the project as it was when the session opened, so it
    needs the work; False: it passed there too; None: not passed, or vmd could not run it
    there (a guest that cannot show the baseline). attempts: runs of the check in the session.
    where: "clean_room" (a fresh machine with the candidate commit; an outcome that does not
    say was made before there was any other) or "session" (the session's own guest, which
    the agent controlled: a check of the machine, never proven).
    """

    passed: bool | None = None
    proven: bool | None = None
    attempts: int = 0
    where: Literal["clean_room", "session"] = "clean_room"

    @classmethod
    def of_outcome(cls, outcome: dict | None, attempts: int | None = None) -> "Verdict":
        """The verdict of finish's outcome (FinishOutcome, or its dict in the record and
        session.json); None: the session did not finish."""
        if not outcome:
            return cls(attempts=attempts or 0)
        passed = bool(outcome.get("passed"))
        runs = outcome.get("attempts") if attempts is None else attempts
        where = "session" if outcome.get("where") == "session" else "clean_room"
        return cls(passed=passed, proven=outcome.get("proven") if passed and where != "session" else None,
                   attempts=runs if isinstance(runs, int) and not isinstance(runs, bool) and runs > 0 else 1,
                   where=where)

    @classmethod
    def of_status(cls, outcome: dict) -> "Verdict":
        """The verdict in the report's outcome (`status` with `proven` and `attempts` beside
        it), as vmd of any version wrote it."""
        status = outcome.get("status")
        ran = status in ("passed", "passed_not_proven", "failed")
        where = "session" if outcome.get("where") == "session" else "clean_room"
        attempts = outcome.get("attempts")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            attempts = 1 if ran else 0  # a vmd from before attempts were counted ran the check once
        if status in ("passed", "passed_not_proven") and where == "session":
            return cls(passed=True, proven=None, attempts=attempts, where=where)
        if status == "passed":
            return cls(passed=True, proven=True, attempts=attempts)
        if status == "passed_not_proven":
            # proven null: vmd could not run the check on the baseline at all -- not proven,
            # but not shown to prove nothing either.
            proven = None if "proven" in outcome and outcome["proven"] is None else False
            return cls(passed=True, proven=proven, attempts=attempts)
        return cls(passed=False if status == "failed" else None, proven=None, attempts=attempts, where=where)

    @property
    def status(self) -> VerdictStatus:
        if self.passed is None:
            return "unverified"
        if not self.passed:
            return "failed"
        return "passed" if self.proven else "passed_not_proven"

    def label(self) -> str:
        """The verdict in a few words: the report's headline, the eval's table, the commit."""
        if self.passed and self.where == "session":
            return "checked in the session's own machine"
        return {"passed": "verified and proven", "passed_not_proven": "passed, not proven",
                "failed": "verification failed", "unverified": "not verified"}[self.status]

    def reason(self) -> str:
        """What the label rests on, as a clause."""
        if self.passed is None:
            return "vmd did not run the agent's check to the end of the session"
        if not self.passed:
            runs = self.attempts or 1
            return f"the check did not pass ({runs} verification run{'s' if runs != 1 else ''} in all)"
        if self.where == "session":
            return ("vmd ran the check in the machine the agent worked in, which the agent controlled, "
                    "so it is weaker than verified and never proven")
        if self.proven:
            return "the check fails on the project as it was before the session"
        if self.proven is False:
            return ("the check also passes on the project as it was before the session, so it does not "
                    "prove the work")
        return "whether the check needs the work could not be checked"

    def place(self, candidate: str | None, quote: str = "") -> str:
        """Where vmd ran the check, as a clause: " on a fresh machine holding commit abc…"
        (the finish's answer, the report, the commit; `quote` marks the sha in Markdown)."""
        if self.where == "session":
            return " in the session's own machine"
        return f" on a fresh machine holding commit {quote}{candidate[:10]}{quote}" if candidate else ""

    def sentence(self) -> str:
        """label: reason -- the line people read in the report, the job's end and the commit."""
        return f"{self.label()}: {self.reason()}"
