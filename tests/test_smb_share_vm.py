"""The project folder over SMB on a real guest (vmd/machines/smb_share.py): the Debian
guest booted with an SmbShare instead of 9p mounts it with the kernel's cifs, writes
honest files and tries every way out a hostile guest has through the share (a symlink, a
device node, a setuid file, a FIFO, a hard link to a file outside the share, a name made
of odd bytes); then vmd commits from bytes, as at a session's close. The honest files
arrive, and nothing special, nothing root's and nothing outside the project exists on the
host. Windows guests get their project this way (they have no 9p driver).
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from vmd.machines.machine import Machine
from vmd.machines.smb_share import smb_dir
from vmd.projects.publish import Remote, commit_project, prepare_project
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

    # The honest files arrived, from vmd's own commit of the folder's bytes.
    tree = git(remote.repo_path, "ls-tree", "-r", "--full-tree", committed.sha)
    entries = {line.split("\t", 1)[1]: line.split()[0] for line in tree.splitlines()}
    assert git(remote.repo_path, "show", f"{committed.sha}:app.py") == "print(42)\n"
    assert git(remote.repo_path, "show", f"{committed.sha}:src/lib.txt") == "honest\n"
    assert git(remote.repo_path, "show", f"{committed.sha}:after-restart.txt") == "after\n"
    assert not {mode for mode in entries.values()} - {"100644", "100755"}, entries  # no link, no gitlink
    assert "shadow-link" not in entries and "null-device" not in entries and "fifo" not in entries

    # Nothing special, nothing root's, nothing outside the project on the host.
    inodes = {}
    for path in [project, *project.rglob("*")]:
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), path
        assert (st.st_uid, st.st_gid) == owner, path
        assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IXOTH | stat.S_IWOTH | stat.S_IROTH), \
            (path, oct(st.st_mode))
        if stat.S_ISREG(st.st_mode):
            inodes.setdefault(st.st_ino, []).append(path)
            assert not stat.S_IMODE(st.st_mode) & 0o111, (path, oct(st.st_mode))  # 0600, as smbd makes
    for ino, paths in inodes.items():  # a hard link stays inside the share
        assert os.lstat(paths[0]).st_nlink == len(paths), paths
    assert os.stat("/etc/passwd").st_nlink == passwd_links
    # smbd's own state stayed in the session's private folder.
    assert stat.S_IMODE(smb_dir(machine.workdir).stat().st_mode) == 0o700
    assert stat.S_IMODE((smb_dir(machine.workdir) / "smb.conf").stat().st_mode) == 0o600
