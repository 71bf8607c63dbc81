"""The host's disk fills up under a running session, on a real guest, with `vmd serve` as
its own process (the last row of the fault matrix: "state dir full").

vmd's state dir is a small tmpfs of its own, so that "the disk is full" is real and
touches nothing else on the host: the guest's overlay, the project folder, vmd's
repository, session.json and the record all live on it. The session checkpoints a file,
then the test fills the tmpfs from the host and the client calls `run`. What a person
cares about:

- the client hears that the host's disk is full, and what to do (free space, open a new
  session), not a bare errno;
- the session ends, and its guest with it;
- the checkpoint committed before the fault is still in vmd's repository, byte for byte,
  and the repository is sound;
- once there is room again, the record and the report say the session ended because the
  disk was full.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.guests import clean_up_domains, domains_of, wait_for
from tests.e2e.test_vmd_faults_vm import libvirt_conn, vmd_process  # noqa: F401 (fixtures)
from vmagent.link import VmdError
from tests.support.vmd_wire import WireVmd

pytestmark = pytest.mark.vm

# The tmpfs under vmd's state dir. After the debian guest's boot the state dir holds about
# 10 MiB (measured: its overlay, the project folder, vmd's repository, the session's files);
# the test asserts the boot left three quarters free, and a quarter GiB fills in a moment.
TMPFS_MIB = 256
PROJECT = "diskfull"
KEPT = "written before the disk filled up\n" + "".join(f"line {i}: the bytes must survive\n" for i in range(200))


def _used_mib(path: Path) -> float:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize / 2**20


def fill(path: Path) -> int:
    """Appends to `path` until the filesystem under it answers ENOSPC (big chunks, then
    page by page) and not one page is left free; returns the bytes written. On a tmpfs one
    free page would do for every session.json vmd saves (the new file takes it, the old one
    gives it back), so the last page counts."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        for _ in range(20):  # something on the tmpfs may give a page back while we fill
            for chunk in (b"\0" * 2**20, b"\0" * 4096, b"\0"):
                while True:
                    try:
                        written += os.write(fd, chunk)
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC, exc
                        break
            if os.statvfs(path.parent).f_bavail == 0:
                return written
    finally:
        os.close(fd)
    raise AssertionError(f"{path.parent} kept getting free pages back while the test filled it")


def git(git_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, check=check,
                          timeout=60)


@pytest.fixture
def tmpfs_work(libvirt_conn):  # noqa: F811 (the fixture imported above)
    """vmd's folder for this test (outside pytest's temp root, which QEMU cannot always
    pass through), with `state/` a tmpfs of TMPFS_MIB. Unmounted after vmd has stopped
    and this test's guests are gone."""
    work = Path(tempfile.mkdtemp(prefix="vmd-diskfull-", dir="/var/tmp"))
    os.chmod(work, 0o711)
    state = work / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m,mode=0755", "tmpfs", str(state)],
                   check=True, capture_output=True, timeout=30)
    try:
        os.chmod(state, 0o755)  # QEMU (libvirt-qemu) passes through it to the overlay
        yield work
    finally:
        clean_up_domains(libvirt_conn, str(work))  # only ours: their files lie under `work`
        umounted = subprocess.run(["umount", str(state)], capture_output=True, text=True, timeout=60)
        if umounted.returncode != 0:  # something still holds it: detach it, never leave it mounted
            subprocess.run(["umount", "-l", str(state)], capture_output=True, timeout=60)
        shutil.rmtree(work, ignore_errors=True)
        assert umounted.returncode == 0, f"the test's tmpfs was busy at its end: {umounted.stderr}"


# What the guest runs once the host's disk is full: a write that makes its own disk grow.
# The write fails on the host and QEMU pauses the guest (werror=enospc), which answers
# nothing from then on; vmd's reaper sees the pause and ends the session while the run
# waits. A guest writes in the background at any moment too, so even `echo` met the pause
# at times: in CI the run then waited on an SSH channel open that paramiko bounds at an hour.
# vmd's own writes that find the disk full are tests/vmd/server/test_session_lifecycle.py's.
GROW_THE_GUEST_DISK = "dd if=/dev/urandom of=/var/tmp/grow bs=1M count=48 conv=fsync status=none; echo wrote"


def test_a_full_state_dir_ends_the_session_keeps_the_checkpoint_and_says_so(tmpfs_work, debian_image,
                                                                           libvirt_conn):  # noqa: F811
    work = tmpfs_work
    state = work / "state"
    repo = state / "repos" / "local" / f"{PROJECT}.git"
    filler = state / "filler"
    with vmd_process(work, debian_image, libvirt_conn) as vmd:
        assert vmd.state == state
        with WireVmd(vmd.socket, timeout=1200) as c:
            sid = c.call("session_open", os="debian", project=PROJECT,
                         task="keep the work when the host's disk fills up")["session_id"]
            c.call("plan_tasks", tasks=["write the file", "more work"])
            c.call("session_ready", timeout=900)
            booted_mib = _used_mib(state)
            assert booted_mib < TMPFS_MIB * 0.75, f"the boot used {booted_mib:.0f} MiB of the {TMPFS_MIB} MiB tmpfs"
            print(f"after the boot: {booted_mib:.1f} MiB used of {TMPFS_MIB} MiB")
            c.call("write_file", path="kept.txt", content=KEPT)
            done = c.call("update_task", id=1, status="done")["text"]
            m = re.search(r"Checkpoint ([0-9a-f]{10}) committed", done)
            assert m, f"no checkpoint commit at the task's end: {done}"
            checkpoint = git(repo, "rev-parse", "main").stdout.decode().strip()
            assert checkpoint.startswith(m[1]), (checkpoint, done)
            assert git(repo, "show", f"{checkpoint}:kept.txt").stdout == KEPT.encode()
            assert domains_of(libvirt_conn, str(work)) == [f"vmagent-{sid}"]

            # The host's disk fills up (here: vmd's state dir, to the last page).
            before_fill = _used_mib(state)
            filled = fill(filler)
            assert os.statvfs(state).f_bavail == 0
            assert booted_mib + filled / 2**20 > TMPFS_MIB * 0.9, (booted_mib, filled)

            started = time.monotonic()
            with pytest.raises(VmdError) as err:
                c.call("run", command=GROW_THE_GUEST_DISK, timeout=60)
            took = time.monotonic() - started
            message = err.value.message
            # What the agent (and the person behind it) reads: the host's disk, not a bare errno,
            # and what to do about it.
            assert message.startswith("the host's disk is full: "), message
            assert "vmd ended the session" in message and "What was committed stays committed" in message, message
            assert "Free space on the host" in message and "open a new session" in message, message
            assert took < 120, f"the full disk took {took:.0f} s to answer"
            print(f"before the fill: {before_fill:.1f} MiB used; the run answered in {took:.1f} s: {message}")

            # The session is over, and so is its guest.
            status = c.call("session_status")
            assert status["state"] == "closed", status
            assert status["ended_by"] == "vmd" and "the host's disk is full" in status["reason"], status
            with pytest.raises(VmdError) as refused:
                c.call("run", command="true", timeout=20)
            assert "is closed" in refused.value.message, refused.value.message
            wait_for(lambda: domains_of(libvirt_conn, str(work)) == [], 60, "the guest's end")

            # What was committed before the fault stays committed, byte for byte.
            assert git(repo, "merge-base", "--is-ancestor", checkpoint, "main", check=False).returncode == 0
            assert git(repo, "show", f"{checkpoint}:kept.txt").stdout == KEPT.encode()
            assert git(repo, "show", "main:kept.txt").stdout == KEPT.encode()

            # Room again: what the full disk held back reaches session.json and the record.
            filler.unlink()
            wait_for(lambda: vmd.session(sid)["state"] == "closed", 60, "session.json saved once there is room")
            wait_for(lambda: any(e["kind"] == "close" for e in vmd.record(sid)), 60,
                     "the record written once there is room")

        close = vmd.session(sid)["close"]
        assert close["ended_by"] == "vmd" and "the host's disk is full" in close["reason"], close
        assert close["machine_destroyed"] is True, close
        # The close names what stays committed, not "nothing", and a dead fast-import left
        # no crash report or half-written pack taking space in vmd's repository.
        if close["commit"] is None:
            assert f"What was committed before stays: {checkpoint[:10]}" in close["text"], close["text"]
        assert "Committed nothing" not in close["text"], close["text"]
        assert not list(repo.glob("fast_import_crash_*")) and not list((repo / "objects" / "pack").glob("tmp_pack_*"))
        lines = (state / "sessions" / sid / "record.jsonl").read_text().splitlines()
        for line in lines:
            json.loads(line)  # whole lines only, none torn by the full disk
        kinds = [json.loads(line)["kind"] for line in lines]
        assert "checkpoint" in kinds and kinds.count("close") == 1, kinds
        fsck = git(repo, "fsck", "--no-progress", check=False)
        assert fsck.returncode == 0, fsck.stderr.decode()

        # A person reads the report later, from a new connection.
        with WireVmd(vmd.socket, timeout=120) as c:
            assert c.call("session_attach", session_id=sid)["state"] == "closed"
            report = c.call("report")["markdown"]
        assert "vmd closed the session: the host's disk is full" in report, report
        assert f"(checkpoint `{checkpoint[:10]}`)" in report, report
        assert domains_of(libvirt_conn, str(work)) == []
