"""vmd's state is private (issue 20, item 4): after a whole session on a local vmd with the
stand-in machines, run under umask 0 (the worst a service manager could hand vmd), no file
under the state dir is readable or writable by group or other, and another uid opens none
of them; vmd's repositories only for VMD_REPOS_GROUP, and then for that group only."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

from tests.conftest import make_traversable
from tests.support.vmd_fakes import LocalMachines, make_config
from tests.support.vmd_wire import WireVmd
from vmd.server.rpc import VmdServer

NOBODY = 65534
READERS_GID = 65000  # a group of the test's own, as VMD_REPOS_GROUP names one


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def whole_session(config) -> str:
    """Open a project, plan, write, run, look at the screen, check in, close."""
    server = VmdServer(config, LocalMachines()).start()
    try:
        with WireVmd(config.socket, timeout=60) as c:
            sid = c.call("session_open", project="calc", task="private state", wait=True)["session_id"]
            c.call("plan_tasks", tasks=["write it"])
            c.call("write_file", path="calc.py", content="print(1 + 1)\n")
            c.call("run", command="python3 calc.py")
            c.call("screenshot")
            c.call("session_close")
    finally:
        server.stop()
    return sid


def entries(root: Path) -> list[Path]:
    found = [root]
    for top, dirs, files in os.walk(root):
        found += [Path(top) / name for name in dirs + files]
    return found


def loose(config) -> list[str]:
    """Entries whose mode lets group or other read or write them (x alone only passes a
    folder), but for what the guest itself wrote inside its project folder (QEMU makes
    those 0600 on a real host; the stand-in guest writes them as this test's umask says,
    and the project folder above them is QEMU's user's, 0700; so in the attic)."""
    repos = config.state_dir / "repos"
    projects = config.projects_dir
    attic = config.state_dir / "attic"  # where an earlier project folder goes, as it was
    found = []
    for path in entries(config.state_dir):
        if any(path.is_relative_to(guests) and len(path.relative_to(guests).parts) > 2
               for guests in (projects, attic)):
            continue
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        allowed = 0o011  # passing through (x) is all a folder may grant
        if path.is_relative_to(repos) and path != repos.parent and config.repos_group:
            allowed |= 0o040 | 0o010  # the readers' group reads; never writes, never other users
        if mode & 0o077 & ~allowed:
            found.append(f"{path.relative_to(config.state_dir)} {mode:04o}")
    return found


def readable_as(uid: int, gid: int, paths: list[Path]) -> list[str]:
    """The paths a process of `uid`/`gid` (no other groups) can open or list, from a forked
    child that drops root for them."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: another user, nothing but trying to read
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            opened = []
            for path in paths:
                try:
                    if path.is_dir():
                        os.listdir(path)
                    else:
                        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW))
                    opened.append(str(path))
                except OSError:
                    pass
            os.write(write, json.dumps(opened).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def test_after_a_whole_session_under_umask_0_nothing_is_open_to_other_users(tmp_path):
    make_traversable(tmp_path)  # pytest's folders are 0700: the other uid must reach the state dir
    config = make_config(tmp_path)
    with umask(0):
        sid = whole_session(config)
    state = config.state_dir
    assert (state / "sessions" / sid / "record.jsonl").is_file()
    assert list((state / "sessions" / sid / "screenshots").iterdir()), "the session saved a screenshot"
    assert (state / "repos" / "local" / "calc.git" / "HEAD").is_file()
    assert loose(config) == []
    paths = entries(state)
    # The state dir and the project owner folder may be passed, not listed; nothing opens.
    assert readable_as(NOBODY, NOBODY, paths) == []


def test_with_vmd_repos_group_that_group_reads_the_repositories_and_nothing_else(tmp_path):
    make_traversable(tmp_path)
    config = make_config(tmp_path, repos_group=str(READERS_GID))
    with umask(0):
        whole_session(config)
        # A second session: objects and refs git writes into an existing repository keep
        # the group's modes too.
        whole_session(config)
    repos = config.state_dir / "repos"
    assert loose(config) == []
    objects = [p for p in entries(repos / "local" / "calc.git" / "objects") if p.is_file()]
    assert objects and all(os.stat(p).st_gid == READERS_GID for p in objects)
    paths = entries(config.state_dir)
    opened = readable_as(NOBODY, READERS_GID, paths)
    assert opened and all(Path(p).is_relative_to(repos) for p in opened), opened
    assert str(repos / "local" / "calc.git" / "HEAD") in opened
    assert readable_as(NOBODY, NOBODY, paths) == []
