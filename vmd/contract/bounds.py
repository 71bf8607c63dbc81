"""What a request may hold: the name rule and the bound of every size, each with its
reason. The params models (params.py), the agent's check (check.py) and the job service
(a job's owner and project, /ask) read them from here.

Every number and text in a request has an upper bound: vmd is root and shared by every
session, and a size it takes from a request is memory or time it spends. Each bound is
well past what an honest agent sends; the reason of each is given with it.

Pure pydantic and stdlib, like the whole contract.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

# --- names ------------------------------------------------------------------------------
# A name is one path component (NAME_PATTERN below), of at most NAME_CHARS.
NAME_CHARS = 100
NAME_RULE = rf"^[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{NAME_CHARS - 1}}}$"
# One rule for owner and project names, used by vmd (folders, repositories) and by the job
# service (checked when a job is created, and by /ask before it asks for a job's history). A name
# is one path component: no '/', no '..', nothing a shell or git could read as an option.
NAME_PATTERN = re.compile(NAME_RULE)
# The owner folder of sessions that name no owner.
LOCAL_OWNER = "local"


def name_problem(what: str, value: str) -> str | None:
    """None when `value` is a usable owner or project name, else a sentence saying why
    not and what to use instead."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value) or value.lower().endswith(".git"):
        return (f"{what} {value!r} is not a usable name: use up to {NAME_CHARS} letters, digits, '-', '_' "
                "and '.', start with a letter, digit or '_', and do not end in .git.")
    return None


# --- sizes ------------------------------------------------------------------------------
# Seconds: the longest command (Run.timeout) and the longest wait for a boot.
MAX_TIMEOUT_S = 7200
# A command is one argument of `bash -c`, and Linux refuses one argument over 128 KiB
# (MAX_ARG_STRLEN); longer scripts belong in a file.
COMMAND_CHARS = 128 * 1024
# The check's own files the agent may name for the baseline (paths in the project).
CHECK_FILES = 64
CHECK_FILE_CHARS = 1000
# What read_file returns at most in one call (vmd/guests/guest.py reads limit + 1 bytes into
# memory; before this bound a limit of 10**12 asked for a terabyte). Read on with offset.
READ_LIMIT = 200_000
# A file offset: JSON's safe integers (2**53, 8 PiB) are past any file in a guest.
MAX_OFFSET = 2**53
# A file's content and edit_file's texts: the request line's own bound (vmd/server/wire.py MAX_LINE).
CONTENT_CHARS = 64 * 1024 * 1024
# A path in the guest (Linux's PATH_MAX), and a launched program's arguments.
PATH_CHARS = 4096
ARGS = 256
# Text for people and the record: the job service allows a task or an answer 20,000
# characters; a model's summary, note or question gets five times as much.
TEXT_CHARS = 100_000
# A task title, a key combination, a name or an id: short by nature.
TITLE_CHARS = 1000
TASKS = 200
KEYS_CHARS = 200
ID_CHARS = 1000
# Typing paces each key (vmd/machines/screen.py KEY_GAP_S, 12 ms): 10,000 characters are two minutes.
TYPE_CHARS = 10_000
# X11 positions are 16 bits; nothing on a screen is further than this.
COORD = 65535
# Scroll clicks in one call (vmd/machines/screen.py sends at most 50).
SCROLL = 1000
# A turn number, a task id: counts far past any session.
MAX_COUNT = 10**9

Title = Annotated[str, Field(max_length=TITLE_CHARS)]
Arg = Annotated[str, Field(max_length=PATH_CHARS)]

# --- history (vmd's repository of a project, read without a session) -----------------------
# Commits in one `history` log: /ask reads 10; 200 with --stat is ~100 KB of text.
HISTORY_COMMITS = 200
# Bytes of git's output in one `history` answer (cut there, and the answer says so): /ask
# reads 64 KiB; 1 MiB is a large diff and still one reply line far under the line bound.
HISTORY_BYTES = 1024 * 1024
# A commit id or a ref name (git's own refs are far shorter).
REV_CHARS = 256
# A revision `history` reads: a commit id or a ref name, with ~N/^N steps back (HEAD~2).
# Never an option ('-'), a range ('..'), a reflog entry ('@{') or a path (':'): vmd
# resolves it to one commit before git reads anything else.
REV_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*(?:[~^][0-9]{0,4})*$")
