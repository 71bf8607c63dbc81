"""Paths in a Windows guest: what the model may name (a drive letter and backslashes or
slashes, or a path under the project), the one form vmd keeps (`Z:\\src\\app.py`: upper-case
drive, backslashes, no `.` or `..`), and the form Windows' sftp-server takes (`/Z:/src/app.py`:
a leading slash before the drive, github.com/PowerShell/Win32-OpenSSH issues 48 and 476).

Names Windows will not keep are refused before any request reaches the guest, with a
sentence: the reserved device names (CON, PRN, AUX, NUL, COM1-9, LPT1-9, with or without an
extension: `nul.txt` is the device too), a trailing dot or space (Windows drops it, so the
file written is not the file named), and the characters no Windows name holds. Names are
case-insensitive on Windows: `Z:\\SRC` and `z:\\src` are one folder, and vmd compares them so.
"""

from __future__ import annotations

import ntpath
import re

from vmd.guests.guest import GuestError

RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{n}" for n in range(1, 10)), *(f"LPT{n}" for n in range(1, 10))}
_BAD_CHARS = re.compile(r'[<>:"|?*\x00-\x1f]')
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


def _name_problem(name: str) -> str | None:
    if name.endswith((".", " ")):
        return "ends with a dot or a space, which Windows drops from a name (the file would not be the one named)"
    if _BAD_CHARS.search(name):
        return 'holds a character no Windows name may hold (< > : " | ? * or a control character)'
    if name.split(".", 1)[0].rstrip(" ").upper() in RESERVED:
        return (f"is a reserved device name on Windows ({name.split('.', 1)[0].upper()}, with any "
                "extension), which no file can have")
    return None


def windows_path(path: str, project_path: str) -> str:
    r"""`path` as one absolute Windows path (`Z:\src\app.py`); a relative path is under the
    project. GuestError with what to write instead when Windows cannot have it."""
    text = path.strip() if path else ""
    if not text:
        return project_path
    if text.startswith(("\\\\", "//")):
        raise GuestError(f"'{path}' is a network (UNC) path; vmd reads and writes files on the guest's own "
                         f"drives: use the project at {project_path} or a path like C:\\Users\\agent\\file.txt")
    if text.startswith("/") and not _DRIVE.match(text[1:]):
        raise GuestError(f"'{path}' is a Linux path; this guest is Windows: use paths like "
                         f"{project_path}src\\app.py, or a path relative to the project")
    if text.startswith("/"):
        text = text[1:]  # sftp's own form, /Z:/...
    if re.match(r"^[A-Za-z]:(?![\\/])", text):
        raise GuestError(f"'{path}' names a drive without a backslash after it (a path relative to that "
                         f"drive's current folder); write it whole, like {text[:2].upper()}\\{text[2:]}")
    if not _DRIVE.match(text):
        text = project_path.rstrip("\\/") + "\\" + text
    full = ntpath.normpath(text.replace("/", "\\"))
    full = full[0].upper() + full[1:]
    for name in full[3:].split("\\"):
        if not name:
            continue
        problem = _name_problem(name)
        if problem:
            raise GuestError(f"'{path}': the name '{name}' {problem}; choose another name.")
    return full


def sftp_path(full: str) -> str:
    r"""The sftp-server's form of a `windows_path`: `Z:\src` -> `/Z:/src`, `Z:\` -> `/Z:/`."""
    return "/" + full.replace("\\", "/")


def same_path(a: str, b: str) -> bool:
    """Whether two `windows_path`s name one file: Windows compares names without case."""
    return a.rstrip("\\").casefold() == b.rstrip("\\").casefold()


def parent(full: str) -> str:
    r"""The folder a `windows_path` is in (`Z:\` for `Z:\a`, `Z:\` for `Z:\`)."""
    return ntpath.dirname(full.rstrip("\\")) if len(full) > 3 else full
