"""The project folder over SMB on a real guest (vmd/machines/smb_share.py): the Debian
guest booted with an SmbShare instead of 9p mounts it with the kernel's cifs, logged on as
the share's own user with its password and every request signed (a guest logon is refused),
writes honest files and tries every way out a hostile guest has through the share (a
symlink, a device node, a setuid file, a FIFO, a hard link to a file outside the share, a
name made of odd bytes); then vmd commits from bytes, as at a session's close. The honest
files arrive, and nothing special, nothing root's and nothing outside the project exists on
the host: every entry is the share's own uid's, which smbd runs as in its sandbox. Windows
guests get their project this way (they have no 9p driver).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from vmd.machines.machine import Machine
from vmd.machines.smb_account import UID_COUNT, UID_MIN
from vmd.machines.smb_share import share_account, smb_dir, smbd_dir
from vmd.projects.publish import commit_project, prepare_project
from vmd.projects.remote import Remote
from vmd.projects.tree import share_owner

pytestmark = pytest.mark.vm

HOSTILE = r"""
cd /mnt/project
printf 'print(42)\n' > app.py
mkdir -p src && printf 'honest\n' > src/lib.txt
try() { label=$1; shift; if "$@" 2>/tmp/err; then echo "$label=made"; else echo "$label=refused $(head -c 120 /tmp/err)"; fi; }
try symlink ln -s /etc/shadow shadow-link
try symlink-in ln -s app.py app-link
try device sudo mknod null-device c 1 3
try fifo mkfifo fifo
try setuid-copy sudo cp /bin/sh rootshell
try setuid sudo chmod 4755 rootshell
try chown-root sudo chown 0:0 rootshell
try hardlink-out ln /etc/passwd passwd-hardlink
try hardlink-in ln app.py app-hardlink
try odd-name touch "$(printf 'odd\001\377name')"
sync
stat -c '%F %a %U %n' * 2>&1
"""


def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True,
                          check=True).stdout


def test_a_guest_on_the_smb_share_writes_honest_files_and_nothing_special_reaches_the_host(
        tmp_path, machine_factory):
    owner = share_owner("libvirt-qemu")
    assert owner is not None, "libvirt's QEMU user is missing"
    remote = Remote(project="app", state_dir=tmp_path / "state")
    project = tmp_path / "projects" / "app"
    prepare_project(project, remote, share_owner=owner)
    passwd_links = os.stat("/etc/passwd").st_nlink

    machine = machine_factory(project, share="smb")
    assert machine.smb_relay is not None and machine.guest.share == "smb"
    facts = machine.ready(timeout=900)
    assert facts.project_mounted, machine.guest.run("mount; dmesg | tail -20", timeout=30).stdout
    # The guest's SMB client reached vmd's smbd (no listener anywhere: the relay's count).
    assert machine.smb_relay.connections >= 1
    account = share_account(machine.workdir)
    assert account is not None and UID_MIN <= account.uid < UID_MIN + UID_COUNT
    # Logged on as the share's user, signed; a guest logon (what vmd's smbd took before it had
    # accounts) gets nothing.
    mounts = machine.guest.run("grep ' cifs ' /proc/mounts", timeout=30).stdout
    # cifs shows a signed session as its security type with an `i` (sec=ntlmsspi).
    assert f"username={account.user}" in mounts and re.search(r",sec=\w+i(,|\s)", mounts), mounts
    assert account.password not in mounts  # the kernel shows no password
    guest_logon = machine.guest.run(
        "sudo mkdir -p /mnt/as-guest && sudo mount -t cifs //10.0.2.4/project /mnt/as-guest "
        "-o ip=10.0.2.4,unc=\\\\10.0.2.4\\project,username=guest,password=,vers=3.0,nounix", timeout=120)
    assert guest_logon.exit_code != 0, guest_logon.stdout + guest_logon.stderr

    done = machine.guest.run(HOSTILE, timeout=300, cwd="/mnt/project")
    said = done.stdout + done.stderr
    print(said)  # what the guest managed, for the log (-s)
    assert done.exit_code == 0, said
    assert "symlink=refused" in said and "device=refused" in said and "fifo=refused" in said, said
    assert "hardlink-out=refused" in said, said

    # vmd restarted: the relay went with the old vmd, and the guest's SMB connection with it.
    # The vmd that re-binds the guest (Machine.attach, as at adoption) finds the share in the
    # domain's XML and relays again; the guest's cifs client reconnects on its own and what
    # it writes next arrives.
    relayed_before = machine.smb_relay
    relayed_before.stop()
    machine = Machine.attach(machine.image, name=machine.name, workdir=machine.workdir, project_dir=project)
    assert machine.smb_relay is not None and machine.smb_relay is not relayed_before
    began = time.monotonic()
    again = machine.guest.run("printf 'after\\n' > /mnt/project/after-restart.txt && sync && cat /mnt/project/app.py",
                              timeout=300)
    print(f"the share back after the relay's restart: {time.monotonic() - began:.1f} s")
    assert again.exit_code == 0 and "print(42)" in again.stdout, again.stdout + again.stderr
    assert machine.smb_relay.connections >= 1
    assert (project / "after-restart.txt").read_text() == "after\n"

    committed = commit_project(project, remote, "after a hostile guest on SMB")
    machine.destroy()
    assert share_account(machine.workdir) is None  # released with its machine: uid free, password gone

    # The honest files arrived, from vmd's own commit of the folder's bytes.
    tree = git(remote.repo_path, "ls-tree", "-r", "--full-tree", committed.sha)
    entries = {line.split("\t", 1)[1]: line.split()[0] for line in tree.splitlines()}
    assert git(remote.repo_path, "show", f"{committed.sha}:app.py") == "print(42)\n"
    assert git(remote.repo_path, "show", f"{committed.sha}:src/lib.txt") == "honest\n"
    assert git(remote.repo_path, "show", f"{committed.sha}:after-restart.txt") == "after\n"
    assert not {mode for mode in entries.values()} - {"100644", "100755"}, entries  # no link, no gitlink
    assert "shadow-link" not in entries and "null-device" not in entries and "fifo" not in entries

    # Nothing special, nothing root's, nothing outside the project on the host: every entry
    # the share's own uid's, which owns nothing else.
    inodes = {}
    for path in [project, *project.rglob("*")]:
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), path
        assert (st.st_uid, st.st_gid) == (account.uid, account.gid), path
        assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IXOTH | stat.S_IWOTH | stat.S_IROTH), \
            (path, oct(st.st_mode))
        if stat.S_ISREG(st.st_mode):
            inodes.setdefault(st.st_ino, []).append(path)
            assert not stat.S_IMODE(st.st_mode) & 0o111, (path, oct(st.st_mode))  # 0600, as smbd makes
    for ino, paths in inodes.items():  # a hard link stays inside the share
        assert os.lstat(paths[0]).st_nlink == len(paths), paths
    assert os.stat("/etc/passwd").st_nlink == passwd_links
    # smbd's own state stayed in the session's private folders.
    assert stat.S_IMODE(smb_dir(machine.workdir).stat().st_mode) == 0o700
    assert stat.S_IMODE(smbd_dir(machine.workdir).stat().st_mode) == 0o700
    assert smbd_dir(machine.workdir).stat().st_uid == 0


def test_a_warm_slot_of_a_guest_on_smb_comes_with_the_sessions_own_share(tmp_path, debian_image, request):
    # The warm pool with a guest whose project comes over SMB (as Windows guests' does): the
    # slot is booted with a placeholder share and saved; the hand-out restores it with
    # smbd's configuration for the session's project, QEMU's socket in the session's folder
    # and a relay there. What the guest writes reaches the session's project, and nothing
    # of the placeholder is seen.
    from vmd.config import VmdConfig
    from vmd.machines.host import local_host
    from vmd.machines.warm_pool import WarmPool

    owner = share_owner("libvirt-qemu")
    image = debian_image.model_copy(update={"share": "smb"})
    # A short state folder, as vmd's own is (/var/lib/vmagent/state): QEMU's SMB socket lies
    # in a slot's folder, and a Unix socket's path has 107 bytes at most.
    state = Path(tempfile.mkdtemp(prefix="vmdw-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(state, ignore_errors=True))
    for folder in (state, state / "sessions"):  # as vmd makes them: QEMU passes through
        folder.mkdir(mode=0o711, exist_ok=True)
        folder.chmod(0o711)
    config = VmdConfig.load(env={}, state_dir=state, images_dir=debian_image.dir.parent, warm_pool_size=1)
    pool = WarmPool(config, local_host(config.libvirt_uri), size=1)
    slot = pool.make_slot(image)
    assert (slot / "saved.img").is_file()
    slot_password = share_account(slot).password  # the slot's own, made before any session
    remote = Remote(project="warm", state_dir=state)
    project = tmp_path / "projects" / "warm"
    prepare_project(project, remote, share_owner=owner)
    (project / "README.md").write_text("the session's own\n")
    os.chown(project / "README.md", *owner)
    workdir = state / "sessions" / "s-warm"
    machine = pool.hand_out(pool.take(image), image, workdir=workdir, project_dir=project, session_id="s-warm")
    try:
        assert machine.restored and machine.smb_relay is not None
        assert machine.smb_relay.socket_path == smb_dir(workdir) / "q.sock"
        # The session's own login, set at the hand-out: not the slot's.
        assert machine.guest.share_login.password == share_account(workdir).password != slot_password
        facts = machine.ready(timeout=600)
        assert facts.project_mounted, machine.guest.run("mount; dmesg | tail -20", timeout=30).stdout
        done = machine.guest.run("cat /mnt/project/README.md && printf 'warm\\n' > /mnt/project/warm.txt && sync "
                                 "&& ls -A /mnt/project", timeout=120)
        assert done.exit_code == 0, done.stdout + done.stderr
        assert "the session's own" in done.stdout
        assert (project / "warm.txt").read_text() == "warm\n"
        assert machine.smb_relay.connections >= 1
    finally:
        machine.destroy()
