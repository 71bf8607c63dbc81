"""The guest's OS family, decided in one place: the tool table words its tools by it, the
prompts pick `prompt.<family>.md` by it, a Ray job asks for a host with an `os_<family>`
slot by it, and a job keeps it (vmagent/loop/job.py `Job.os_family`).

vmd says the family: `session_open` answers `os_family` from the image's manifest, and an
image may be called anything ("wintermute" can be Debian), so its name is no guide. The name
is read only where there is no answer: a vmd older than that answer, or before a session is
open (the CLI's check that the prompts load, a Ray job placed before its vmd is asked).
"""

from __future__ import annotations

from typing import Literal, get_args

OsFamily = Literal["linux", "windows"]
FAMILIES: tuple[str, ...] = get_args(OsFamily)


def os_family_of(os_name: str, answered: str | None = None) -> OsFamily:
    """The family vmd answered whenever it names one known here; else read from the name:
    'windows', 'win11', 'Windows Server' -> windows; anything else (debian, ubuntu) -> linux."""
    if answered in FAMILIES:
        return answered  # type: ignore[return-value]  # one of FAMILIES is an OsFamily
    return "windows" if str(os_name).strip().lower().startswith("win") else "linux"
