"""The hidden check's side of vmd's out-of-band result (vmd/session/handlers/eval_verbs.py).

Copied beside every eval's check files (vmagent/eval/tasks.py) and imported first by its
check.py, which vmd runs as `/usr/bin/python3 -I "$CHECK_DIR/check.py"` in a clean room
(a fresh machine with the committed project). A bare exit 0 is not "solved": vmd counts
the check as passed only when $CHECK_RESULT holds the nonce vmd left in $CHECK_DIR/.nonce,
and this module takes that nonce before any of the project's code runs:

- the nonce file is read and removed at import, and this process is made undumpable
  (prctl PR_SET_DUMPABLE 0), so a process of the project's cannot read it from the file,
  from this process's memory or from /proc;
- the project's code runs only in child processes (`run`, `values`), with an environment
  that names neither $CHECK_DIR nor $CHECK_RESULT;
- `values` calls the project's functions in a child and returns what they gave back, so
  the check compares them here, where the project's code never ran: a module that exits
  0 on import, or prints "OK", gives no values and fails.

Runs in the guest, never imported by vmagent: the standard library only.
"""

import ctypes
import json
import os
import subprocess
import sys

PYTHON = "/usr/bin/python3"
CHECK_DIR = os.environ.get("CHECK_DIR", "")
_RESULT = os.environ.get("CHECK_RESULT", "")


def _take_nonce() -> str:
    path = os.path.join(CHECK_DIR, ".nonce")
    try:
        with open(path) as fh:
            nonce = fh.read().strip()
        os.unlink(path)
    except OSError:
        return ""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass
    return nonce


_NONCE = _take_nonce()
PROJECT = os.getcwd()


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHECK_", "PYTHON"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run(args, extra_env=None, **kwargs) -> subprocess.CompletedProcess:
    """A command of the project's (a list), in a child whose environment names nothing of
    the check's but `extra_env`. `python` as the first word is this machine's own
    interpreter, run without the user's site folder or PYTHON* variables."""
    args = list(args)
    if args and args[0] in ("python", "python3"):
        args[0:1] = [PYTHON, "-E", "-s"]
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("timeout", 120)
    kwargs.setdefault("stdin", subprocess.DEVNULL if "input" not in kwargs else None)
    if kwargs.get("stdin") is None:
        kwargs.pop("stdin")
    return subprocess.run(args, env={**_env(), **(extra_env or {})}, **kwargs)


_CALLER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
mod = __import__(sys.argv[2], fromlist=["_"])
out = []
for name, args in json.loads(sys.stdin.read()):
    try:
        value = getattr(mod, name)(*args)
        json.dumps(value)
        out.append({"value": value})
    except BaseException as exc:
        out.append({"raised": type(exc).__name__})
sys.stdout.write("\n@@vmdcheck@@" + json.dumps(out))
"""


def values(module: str, calls, cwd: str | None = None) -> list:
    """[(function name, [args])] of `module` (dotted, found in the project folder), each
    called in a child process: [{"value": v} or {"raised": "ValueError"}], in order.
    AssertionError when the child gave no answer for every call."""
    r = run([PYTHON, "-I", "-c", _CALLER, cwd or PROJECT, module], input=json.dumps(list(calls)),
            cwd=cwd or PROJECT)
    head, sep, tail = r.stdout.rpartition("\n@@vmdcheck@@")
    assert sep, f"{module} gave no answers (exit {r.returncode}): {r.stderr[-800:]}"
    got = json.loads(tail)
    assert isinstance(got, list) and len(got) == len(list(calls)), f"{module} answered {len(got)} calls"
    return got


def solved(message: str = "solved") -> None:
    """The check passed: its result, for vmd to read after the run."""
    if _RESULT and _NONCE:
        fd = os.open(_RESULT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(_NONCE)
    print(message)
    sys.stdout.flush()
