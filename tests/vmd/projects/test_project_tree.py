"""The project folder as vmd reads it (`walk`) and writes it for the guest
(`present_to_guest`), with QEMU's 9p `mapped-xattr` metadata made directly on the host."""

from __future__ import annotations

import os
import stat
import struct
import subprocess
from pathlib import Path

import pytest

from vmd.projects.tree import (GUEST_GID, GUEST_UID, XATTR_GID, XATTR_MODE, XATTR_UID, Limits,
                              present_to_guest, walk)
from vmd.projects.repository import Repository

MIB = 1024 * 1024


def mark(path: Path, mode: int) -> None:
    """What QEMU stores for a file the guest made with `mode`."""
    os.setxattr(path, XATTR_MODE, struct.pack("<I", mode), follow_symlinks=False)


def xattr(path: Path, name: str) -> int:
    return struct.unpack("<I", os.getxattr(path, name, follow_symlinks=False))[0]


def entries(folder: Path, limits: Limits | None = None) -> dict[bytes, tuple]:
    return {e.path: (e.kind, e.target if e.kind == "link" else e.executable)
            for e in walk(folder, limits).entries}


@pytest.fixture
def folder(tmp_path) -> Path:
    path = tmp_path / "share"
    path.mkdir()
    return path


# --- mapped-xattr: what the guest made, as QEMU stores it --------------------------------

def test_a_regular_file_marked_as_a_link_is_committed_as_a_link(folder, tmp_path):
    (folder / "config").write_bytes(b"/etc/passwd")
    mark(folder / "config", stat.S_IFLNK | 0o777)
    (folder / "plain").write_text("text")
    assert entries(folder) == {b"config": ("link", b"/etc/passwd"), b"plain": ("file", False)}
    repo = Repository(tmp_path / "repo.git")
    sha, new = repo.commit(walk(folder), "links")
    assert new
    listing = subprocess.run(["git", "--git-dir", str(repo.path), "ls-tree", sha, "config"],
                             capture_output=True, text=True, check=True).stdout
    mode, _, blob = listing.split("\t")[0].split()
    assert mode == "120000"
    assert subprocess.run(["git", "--git-dir", str(repo.path), "cat-file", "blob", blob],
                          capture_output=True, check=True).stdout == b"/etc/passwd"


@pytest.mark.parametrize("kind, said", [(stat.S_IFCHR, "character device"),
                                        (stat.S_IFBLK, "block device"),
                                        (stat.S_IFIFO, "named pipe (FIFO)"),
                                        (stat.S_IFSOCK, "socket")])
def test_a_regular_file_marked_as_a_device_or_fifo_is_left_out_with_a_note(folder, kind, said):
    (folder / "node").write_bytes(b"")
    mark(folder / "node", kind | 0o666)
    (folder / "kept.txt").write_text("kept")
    tree = walk(folder)
    assert [e.path for e in tree.entries] == [b"kept.txt"]
    assert tree.left_out == [f"node: a {said}, which git cannot hold; left out."]


def test_the_exec_bit_comes_from_the_mapped_mode_not_the_hosts(folder):
    (folder / "script").write_text("#!/bin/sh\n")
    os.chmod(folder / "script", 0o600)  # as QEMU keeps every file
    mark(folder / "script", stat.S_IFREG | 0o755)
    (folder / "data").write_text("x")
    os.chmod(folder / "data", 0o755)
    mark(folder / "data", stat.S_IFREG | 0o644)
    assert entries(folder) == {b"data": ("file", False), b"script": ("file", True)}


def test_without_a_mapped_mode_the_hosts_mode_counts(folder):
    (folder / "script").write_text("#!/bin/sh\n")
    os.chmod(folder / "script", 0o755)
    (folder / "data").write_text("x")
    (folder / "zero").write_text("x")
    os.setxattr(folder / "zero", XATTR_MODE, b"\0\0")  # too short to be QEMU's
    assert entries(folder) == {b"data": ("file", False), b"script": ("file", True),
                               b"zero": ("file", False)}


def test_a_folder_marked_as_a_link_is_left_out_with_a_note(folder):
    (folder / "dir").mkdir()
    (folder / "dir" / "inner.txt").write_text("x")
    mark(folder / "dir", stat.S_IFLNK | 0o777)
    (folder / "kept.txt").write_text("kept")
    tree = walk(folder)
    assert [e.path for e in tree.entries] == [b"kept.txt"]
    assert tree.left_out == ["dir: a link whose target could not be read; left out."]


def test_a_mapped_link_with_an_oversized_or_empty_target_is_left_out(folder):
    (folder / "long").write_bytes(b"x" * 5000)
    mark(folder / "long", stat.S_IFLNK | 0o777)
    (folder / "empty").write_bytes(b"")
    mark(folder / "empty", stat.S_IFLNK | 0o777)
    tree = walk(folder)
    assert tree.entries == []
    assert sorted(tree.left_out) == ["empty: a link whose target could not be read; left out.",
                                     "long: a link whose target could not be read; left out."]


def test_a_real_host_link_is_read_not_followed(folder):
    (folder / "passwd").symlink_to("/etc/passwd")
    (folder / "etc").symlink_to("/etc")
    assert entries(folder) == {b"etc": ("link", b"/etc"), b"passwd": ("link", b"/etc/passwd")}


def test_git_entries_in_every_spelling_are_left_out_and_nested_ones_noted(folder):
    for name in (".git", ".GIT", ".git.", ".Git. .", "git~1", ".gitignore", ".github"):
        (folder / name).mkdir()
        (folder / name / "f").write_text("x")
    for name in (".git\\config", ".git:x", ".GIT .:y", "git~1\\x", ".gitx:y"):
        (folder / name).write_text("x")
    (folder / "sub").mkdir()
    (folder / "sub" / ".git").write_text("gitdir: /elsewhere\n")
    (folder / "sub" / "GIT~1").mkdir()
    tree = walk(folder)
    assert [e.path for e in tree.entries] == [b".github/f", b".gitignore/f", b".gitx:y"]
    assert [note.split(":")[0] for note in tree.left_out] == ["sub/.git", "sub/GIT~1"]


# --- limits -------------------------------------------------------------------------------

def test_a_file_over_the_file_limit_is_left_out_with_a_note(folder):
    (folder / "big.bin").touch()
    os.truncate(folder / "big.bin", 3 * MIB)  # sparse
    (folder / "small").write_text("x")
    tree = walk(folder, Limits(max_file_bytes=2 * MIB))
    assert [e.path for e in tree.entries] == [b"small"]
    assert tree.left_out == ["big.bin: 3.0 MiB is over the 2.0 MiB limit for one file; left out "
                             "of the commit (it stays in the folder)."]


def test_files_past_the_total_limit_are_left_out_and_the_rest_kept(folder):
    for name in ("a", "b", "c"):
        (folder / name).touch()
        os.truncate(folder / name, MIB)
    (folder / "d").write_text("tiny")
    tree = walk(folder, Limits(max_total_bytes=2 * MIB + 100))
    assert [e.path for e in tree.entries] == [b"a", b"b", b"d"]
    assert tree.total_bytes == 2 * MIB + 4
    assert tree.left_out == ["c: 1.0 MiB would take the commit past its 2.0 MiB total; left out."]


def test_entries_past_the_entry_limit_are_left_out_with_a_note(folder):
    for i in range(10):
        (folder / f"f{i}").write_text(str(i))
    tree = walk(folder, Limits(max_entries=4))
    assert [e.path for e in tree.entries] == [b"f0", b"f1", b"f2", b"f3"]
    assert tree.left_out == ["everything after f4: the folder holds more than 4 entries; left out."]


def test_folders_deeper_than_the_depth_limit_are_left_out_with_a_note(folder):
    deep = folder / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    (deep / "bottom.txt").write_text("x")
    (folder / "a" / "b" / "mid.txt").write_text("x")
    tree = walk(folder, Limits(max_depth=2))
    assert [e.path for e in tree.entries] == [b"a/b/mid.txt"]
    assert tree.left_out == ["a/b/c/: nested deeper than 2 folders; left out."]


# --- what changes between the walk and the read -------------------------------------------

def commit_blob(tmp_path: Path, tree, path: bytes) -> bytes:
    repo = Repository(tmp_path / "repo.git")
    sha, _ = repo.commit(tree, "race")
    return repo.git("cat-file", "blob", f"{sha}:{path.decode()}").stdout


def test_a_file_swapped_for_a_link_after_the_walk_is_not_followed(folder, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("host secret!")
    (folder / "a.txt").write_text("guest words!")
    tree = walk(folder)
    (folder / "a.txt").unlink()
    (folder / "a.txt").symlink_to(secret)
    assert commit_blob(tmp_path, tree, b"a.txt") == b"\0" * len("guest words!")


def test_a_file_that_grew_or_shrank_after_the_walk_keeps_its_walked_size(folder, tmp_path):
    (folder / "grew").write_text("1234")
    (folder / "shrank").write_text("12345678")
    tree = walk(folder)
    (folder / "grew").write_text("1234 and much more")
    (folder / "shrank").write_text("12")
    assert commit_blob(tmp_path, tree, b"grew") == b"1234"
    assert commit_blob(tmp_path, tree, b"shrank") == b"12" + b"\0" * 6


# --- present_to_guest: vmd's files as the guest should see them ---------------------------

def test_present_to_guest_turns_a_real_link_into_a_mapped_one(folder):
    (folder / "sub").mkdir()
    (folder / "sub" / "passwd").symlink_to("/etc/passwd")
    (folder / "sub" / "file.txt").write_text("x")
    present_to_guest(folder, None)
    link = folder / "sub" / "passwd"
    assert not link.is_symlink() and link.is_file()
    assert link.read_bytes() == b"/etc/passwd"
    assert xattr(link, XATTR_MODE) == stat.S_IFLNK | 0o777
    for path in (folder, folder / "sub", link, folder / "sub" / "file.txt"):
        assert xattr(path, XATTR_UID) == GUEST_UID == 1000
        assert xattr(path, XATTR_GID) == GUEST_GID == 1000
    assert stat.S_IMODE(os.lstat(link).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(folder / "sub").st_mode) == 0o700
    assert xattr(folder / "sub", XATTR_MODE) == stat.S_IFDIR | 0o755
    assert entries(folder) == {b"sub/file.txt": ("file", False),
                               b"sub/passwd": ("link", b"/etc/passwd")}


def test_present_to_guest_keeps_the_exec_bit_in_the_mapped_mode_and_drops_setuid(folder):
    (folder / "tool").write_text("#!/bin/sh\n")
    os.chmod(folder / "tool", 0o4755)
    present_to_guest(folder, None)
    assert xattr(folder / "tool", XATTR_MODE) == stat.S_IFREG | 0o755
    assert stat.S_IMODE(os.lstat(folder / "tool").st_mode) == 0o600
    assert entries(folder) == {b"tool": ("file", True)}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another uid")
def test_present_to_guest_gives_everything_to_qemus_user(folder):
    (folder / "sub").mkdir()
    (folder / "sub" / "file.txt").write_text("x")
    (folder / "link").symlink_to("sub/file.txt")
    present_to_guest(folder, (4242, 4343))
    for path in (folder, folder / "sub", folder / "sub" / "file.txt", folder / "link"):
        st = os.lstat(path)
        assert (st.st_uid, st.st_gid) == (4242, 4343), path
