"""A guest that runs commands and moves files: one small interface, one class per OS.

Callers (the session, the tests, the benchmark) use `Guest` and never learn whether it
is Linux over SSH (vmd/guests/linux/guest.py) or Windows over SSH with PowerShell
(vmd/guests/windows/guest.py). The verbs whose command differs by OS (launch_app, check_internet,
list_windows, ...) are in vmd/guests/linux/verbs.py and vmd/guests/windows/verbs.py, one class
per OS mixed into that OS's guest. Every error a person or the model will read is a
`GuestError` with a sentence that says what to do; a guest raises nothing else on purpose.
"""

from __future__ import annotations

import stat
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

from pydantic import BaseModel

from vmd.errors import WordedError

OutputCallback = Callable[[str, str], None]  # (stream, line)


class GuestError(WordedError):
    """Something the guest refused or could not do; the message is for the model."""


class CommandResult(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    truncated: bool = False
    timed_out: bool = False


class FileChunk(BaseModel):
    content: str
    size: int
    offset: int
    truncated: bool


class GuestFacts(BaseModel):
    """What a guest says of itself once it answers (the machine adds its own: vmd/machines/port.py Facts)."""

    os: str
    kernel: str
    python: str
    git: str
    desktop: bool
    project_mounted: bool
    boot_id: str
    hostname: str


class ListedWindow(BaseModel):
    """A top-level window as the guest lists it, in the guest's framebuffer pixels: its inside
    (below the title bar) and its frame's width on each side (left, right, top, bottom)."""

    title: str
    x: int
    y: int
    width: int
    height: int
    active: bool = False
    frame: tuple[int, int, int, int] = (0, 0, 0, 0)


# X11 positions are 16-bit signed and sizes 16-bit unsigned, Windows' are 32-bit but no screen
# is past this: a number beyond it in a guest's window listing is no coordinate.
COORD_LIMIT = 65535


def screen_coordinate(text: str) -> int:
    """A pixel position or size read from a guest's text; ValueError past COORD_LIMIT, where
    `round(x * scale)` of a huge number raised OverflowError and failed the screenshot verb."""
    text = text.strip()
    if len(text) > 7:  # -65535..65535 needs 6
        raise ValueError(f"{text[:20]!r} is no screen coordinate")
    value = int(text)
    if not -COORD_LIMIT <= value <= COORD_LIMIT:
        raise ValueError(f"{value} is no screen coordinate")
    return value


class DirEntry(BaseModel):
    name: str
    type: str  # "file" | "dir" | "link" | "other"
    size: int


class DirListing(list):
    """A folder's entries (a list of DirEntry), with `note`: a sentence when the listing
    was cut (vmd/guests/ssh.py LIST_MAX_ENTRIES, LIST_TIME_S), else ""."""
    note: str = ""


def entry_kind(mode: int) -> str:
    """An SFTP entry's kind from its mode bits, as the agent sees it."""
    return ("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode)
            else "link" if stat.S_ISLNK(mode) else "other")


def listing_of(folder, *, list_time_s: float, fold_case: bool, narrower: str, long_names: str) -> DirListing:
    """A folder as SFTP listed it (vmd/guests/ssh.py `list_folder`: entries, more,
    timed_out, long_names) as the agent's DirListing: folders first, then by name (case
    folded where the OS ignores case), with a note that says what was left out and how to
    see it (`narrower`: the OS's own way; `long_names`: what the OS calls a name too long)."""
    def key(e: DirEntry):
        return (e.type != "dir", e.name.casefold() if fold_case else e.name)

    entries = DirListing(sorted((DirEntry(name=e.name, type=entry_kind(e.mode), size=e.size)
                                 for e in folder.entries), key=key))
    notes = []
    if folder.more:
        notes.append(f"the first {len(entries)} entries are listed and more entries were not listed; "
                     f"list a narrower folder or use {narrower}")
    elif folder.timed_out:
        notes.append(f"the guest took longer than {list_time_s:g} s to list the folder, so only the "
                     f"{len(entries)} entries read by then are listed; list a narrower folder or use {narrower}")
    if folder.long_names:
        notes.append(f"{folder.long_names} entries with names over {long_names} were left out")
    entries.note = "; ".join(notes)
    return entries


@dataclass(frozen=True)
class ShareLogin:
    """Who the guest maps its SMB project share as (vmd/machines/smb_account.py): the share's
    own user and random password. The password goes to the guest in the mapping command
    alone, never into a log line, an error or the record."""
    user: str
    password: str = field(repr=False)


class Guest(ABC):
    os_family: str
    project_path: str
    # How the machine shares the project folder ("9p" or "smb": the image's manifest, or a
    # test's choice; vmd/machines/boot_share.py), which `mount_share` mounts.
    share: str = "9p"
    # The SMB share's login (the machine sets it from the share's account); None on 9p.
    share_login: ShareLogin | None = None

    @abstractmethod
    def run(self, command: str, timeout: float = 300, cwd: str | None = None,
            on_output: OutputCallback | None = None) -> CommandResult: ...

    @abstractmethod
    def read_file(self, path: str, offset: int = 0, limit: int | None = None) -> FileChunk: ...

    @abstractmethod
    def write_file(self, path: str, content: str | bytes) -> int: ...

    @abstractmethod
    def append_file(self, path: str, content: str | bytes) -> int: ...

    @abstractmethod
    def list_dir(self, path: str) -> list[DirEntry]: ...

    def edit_file(self, path: str, old: str, new: str) -> None:
        text = self.read_file(path, 0, None).content
        count = text.count(old)
        if count != 1:
            where = "nowhere" if count == 0 else f"{count} times"
            raise GuestError(
                f"edit_file {path}: the text to replace matched {where}; it must match exactly "
                "once. Read the file again and quote a longer, unique passage."
            )
        self.write_file(path, text.replace(old, new, 1))

    # Every command that differs by OS is a method here, written per OS in
    # vmd/guests/linux/verbs.py: the verbs, and what the machine asks of its guest.

    @abstractmethod
    def facts(self) -> GuestFacts: ...

    @abstractmethod
    def desktop_problem(self) -> str | None: ...  # None once the desktop is up, else what is missing

    @abstractmethod
    def mount_share(self) -> str | None: ...  # the project share, unless it is mounted: None, or why not

    @abstractmethod
    def restored(self, now: float, mount_share: bool) -> GuestFacts: ...  # a saved guest woken: clock, share, facts

    # A parked warm slot's (vmd/machines/parked_slot.py): only guests whose commands go through
    # a runner kept in the guest (LinuxGuest) are parked.
    def prewarmed(self, timeout: float) -> bool:
        """Whether a command runner waits idle in the guest, the one `restored` started."""
        return False

    def keep_root_runner(self) -> bool:
        """Whether a runner as root was started and kept for `resumed`."""
        return False

    def resumed(self, now: float) -> bool:
        """A parked guest at work again: its clock set; whether the project share is mounted."""
        raise GuestError(f"a {self.os_family} guest is never parked, so it cannot be resumed as one")

    @abstractmethod
    def reboot(self) -> None: ...  # asks the guest to restart; it goes away at once

    @abstractmethod
    def forget_identity(self) -> None: ...  # new host keys and machine id, share unmounted: before a save

    @abstractmethod
    def list_windows(self) -> list[ListedWindow]: ...  # visible top-level windows, front first

    @abstractmethod
    def launch_app(self, path: str, args: list[str]) -> str: ...

    @abstractmethod
    def check_internet(self, host: str) -> tuple[bool, str]: ...

    @abstractmethod
    def close(self) -> None: ...
