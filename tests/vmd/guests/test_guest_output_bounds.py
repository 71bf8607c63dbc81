"""What a hostile guest sends vmd is bounded in memory and time: a listing of a million
entries, a listing dribbled forever, an exec channel that prints forever, a runner whose
hello never comes. vmd runs as root and is shared by every session; one guest must not
grow it or hold a verb past its deadline.

The guest is a real SSH server (paramiko's, tests/support/hostile_sshd.py) on loopback, whose
sftp-server and shell are the attacker's.
"""

from __future__ import annotations

import struct
import threading
import time

import pytest

from tests.support.hostile_sshd import (CLOSE, EOF, HANDLE, LSTAT, NO_SUCH_FILE, OPEN, OPENDIR, READDIR, STAT, HostileSshd,
                                        file_attrs, names, packet, status, string, u32)
from vmd.guests.linux.guest import LinuxGuest
from vmd.guests.linux.runner_link import RUNNER_SOURCE, RunnerPool, SshRunnerLauncher
from vmd.guests.ssh import LIST_MAX_ENTRIES, SshConnection


def rss_bytes() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.fixture
def sshd(tmp_path):
    server = HostileSshd(tmp_path)
    yield server
    server.close()


def connect(sshd: HostileSshd) -> SshConnection:
    return SshConnection("127.0.0.1", sshd.port, "agent", str(sshd.key_path))


def listing_server(total: int | None, per_reply: int = 100, delay: float = 0.0, closes: list | None = None):
    """An sftp-server whose every folder holds `total` files (None: without end), sent
    `per_reply` a reply, each reply after `delay` s."""
    sent = {"n": 0}

    def handle(kind, request_id, body):
        if kind == OPENDIR:
            yield packet(HANDLE, u32(request_id) + string(b"h1"))
        elif kind == READDIR:
            if delay:
                time.sleep(delay)
            start = sent["n"]
            count = per_reply if total is None else min(per_reply, total - start)
            if count <= 0:
                yield status(request_id, EOF)
                return
            sent["n"] += count
            yield names(request_id, ((b"f%07d" % n, n) for n in range(start, start + count)))
        elif kind == CLOSE:
            if closes is not None:
                closes.append(request_id)
            yield status(request_id, 0)
        else:
            yield status(request_id, NO_SUCH_FILE)

    return handle, sent


def test_a_listing_of_a_million_entries_is_capped_in_memory_with_a_sentence(sshd):
    closes: list = []
    sshd.sftp_handler, sent = listing_server(1_000_000, closes=closes)
    guest = LinuxGuest(connect(sshd), use_runner=False)
    guest.ssh.sftp()  # the client's own start is not what is measured
    before = rss_bytes()
    started = time.monotonic()
    entries = guest.list_dir("/mnt/project/big")
    grown = rss_bytes() - before
    seconds = time.monotonic() - started
    assert grown < 50 * 1024 * 1024, f"vmd grew by {grown / 2**20:.1f} MiB in {seconds:.1f} s"
    assert len(entries) == LIST_MAX_ENTRIES
    assert sent["n"] < 2 * LIST_MAX_ENTRIES, "vmd kept reading past its cap"
    assert "more entries were not listed" in entries.note and "ls | head" in entries.note
    assert seconds < 20, seconds
    print(f"list_dir of 1,000,000 entries: RSS +{grown / 2**20:.1f} MiB, {seconds:.2f} s, "
          f"{sent['n']} entries sent")
    # The handle was closed, and the client is still in step: the next listing works.
    deadline = time.monotonic() + 5
    while not closes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert closes, "the folder's handle was not closed"
    sshd.sftp_handler, _ = listing_server(3)
    assert [e.name for e in guest.list_dir("/mnt/project/small")] == ["f0000000", "f0000001", "f0000002"]
    guest.close()


def test_the_list_dir_verb_says_the_listing_was_cut(sshd):
    from vmd.session.handlers.shell_verbs import list_dir
    from vmd.contract.params import ListDir
    from vmd.contract.results import result_problem

    sshd.sftp_handler, _ = listing_server(LIST_MAX_ENTRIES + 500)
    guest = LinuxGuest(connect(sshd), use_runner=False)

    class _Session:
        def ready_machine(self):
            return type("M", (), {"guest": guest})()

    result = list_dir(_Session(), ListDir(path="big"), None)
    assert len(result["entries"]) == LIST_MAX_ENTRIES
    assert result["text"].endswith("list a narrower folder or use run('ls | head').]")
    assert result_problem("list_dir", result) is None
    guest.close()


def test_a_listing_dribbled_forever_is_stopped_by_the_total_time_bound(sshd, monkeypatch):
    """One entry a reply, each reply quick enough for the per-reply bound, without end."""
    monkeypatch.setattr("vmd.guests.ssh.LIST_TIME_S", 2.0)
    monkeypatch.setattr("vmd.guests.linux.guest.LIST_TIME_S", 2.0)
    sshd.sftp_handler, sent = listing_server(None, per_reply=1, delay=0.05)
    guest = LinuxGuest(connect(sshd), use_runner=False)
    guest.ssh.sftp_reply_timeout = 10
    started = time.monotonic()
    entries = guest.list_dir("/mnt/project/slow")
    seconds = time.monotonic() - started
    assert seconds < 6, seconds
    assert 0 < len(entries) < LIST_MAX_ENTRIES
    assert "took longer than 2 s" in entries.note
    guest.close()


def test_a_reply_sent_a_byte_at_a_time_is_bounded_as_a_whole(sshd, monkeypatch):
    """paramiko bounds each recv; a reply whose bytes come slower than that but never
    stop held the verb for ever. Now the whole reply has the per-reply bound."""

    def handle(kind, request_id, body):
        if kind == OPENDIR:
            reply = packet(HANDLE, u32(request_id) + string(b"h1"))
            for n in range(len(reply)):
                time.sleep(0.3)
                yield reply[n:n + 1]
        else:
            yield status(request_id, NO_SUCH_FILE)

    sshd.sftp_handler = handle
    guest = LinuxGuest(connect(sshd), use_runner=False)
    guest.ssh.sftp_reply_timeout = 1.5  # each byte comes well within it
    started = time.monotonic()
    with pytest.raises(Exception, match="did not answer within 1.5 s"):
        guest.list_dir("/mnt/project")
    assert time.monotonic() - started < 5
    guest.close()


def test_a_reply_the_guest_says_is_huge_is_refused_before_it_is_read(sshd):
    def handle(kind, request_id, body):
        if kind == OPENDIR:
            yield u32(200 * 1024 * 1024) + bytes([HANDLE]) + b"\0" * 65536
        else:
            yield status(request_id, NO_SUCH_FILE)

    sshd.sftp_handler = handle
    guest = LinuxGuest(connect(sshd), use_runner=False)
    with pytest.raises(Exception, match="packet of 209715200 bytes"):
        guest.list_dir("/mnt/project")
    guest.close()


def test_a_name_longer_than_any_file_name_and_a_count_the_reply_lacks(sshd):
    def handle(kind, request_id, body):
        if kind == OPENDIR:
            yield packet(HANDLE, u32(request_id) + string(b"h1"))
        elif kind == READDIR and not handle.done:
            handle.done = True
            reply = names(request_id, [(b"ok.txt", 3), (b"x" * 5000, 1)])
            # The count says four billion entries; the reply holds two.
            body_ = reply[5:]
            body_ = body_[:4] + u32(2**32 - 1) + body_[8:]
            yield packet(reply[4], body_)
        else:
            yield status(request_id, EOF if kind == READDIR else 0)

    handle.done = False
    sshd.sftp_handler = handle
    guest = LinuxGuest(connect(sshd), use_runner=False)
    started = time.monotonic()
    entries = guest.list_dir("/mnt/project")
    assert time.monotonic() - started < 5
    assert [e.name for e in entries] == ["ok.txt"]
    assert "1 entries with names over 255 bytes" in entries.note
    guest.close()


# --- the exec fallback and the runner's hello ------------------------------------------


def prints_forever(command, channel):
    """The guest's shell: every command prints without end and never exits, whatever
    `timeout` wraps it; the kill vmd sends afterwards is answered."""
    if "VMD_RUN=" in command and "grep -lsa" in command:
        channel.send_exit_status(0)
        channel.close()
        return
    while not channel.closed:
        channel.sendall((b"y" * 99 + b"\n") * 80)


def test_the_exec_fallback_stops_at_the_deadline_while_output_keeps_coming(sshd):
    sshd.exec_handler = prints_forever
    guest = LinuxGuest(connect(sshd), use_runner=False)
    lines = []

    def watcher(stream, line):  # a watcher slower than the guest: output is always waiting
        lines.append(line)
        time.sleep(0.001)

    started = time.monotonic()
    result = guest.run("yes", timeout=1, on_output=watcher)
    seconds = time.monotonic() - started
    assert result.timed_out and result.exit_code == 124
    # 1 s, vmd's 10 s margin for the guest's own `timeout -k`, and one read's worth of lines.
    assert seconds < 16, f"run(timeout=1) took {seconds:.1f} s"
    assert result.stdout.startswith("y" * 99 + "\n") and result.truncated and lines
    assert "ran past its 1 s timeout" in result.stderr
    guest.close()


def sftp_with_the_runner(kind, request_id, body):
    """An sftp-server that says the runner is in place, and takes any upload of it."""
    if kind in (STAT, LSTAT):
        yield packet(105, u32(request_id) + file_attrs(len(RUNNER_SOURCE)))
    elif kind == OPEN:
        yield packet(HANDLE, u32(request_id) + string(b"f1"))
    else:
        yield status(request_id, 0)


@pytest.mark.parametrize("hello", ["silent", "stderr flood", "endless frame"])
def test_a_runner_whose_hello_never_comes_costs_its_start_time_once(sshd, hello):
    """The guest fails the runner's hello to force the exec fallback: the first command
    waits the start bound once (no second upload and wait), with vmd's memory flat
    whatever the runner's channel sends, and then runs through exec (whose deadline the
    test above holds)."""

    def shell(command, channel):
        if command.startswith("python3 "):
            if hello == "silent":
                time.sleep(30)
            elif hello == "stderr flood":
                while not channel.closed:
                    channel.sendall_stderr(b"e" * 65536)
            else:  # a hello frame whose length is under the cap, its bytes dribbled without end
                channel.sendall(struct.pack(">cI", b"H", 4096))
                while not channel.closed:
                    channel.sendall(b" ")
                    time.sleep(0.01)
            return
        channel.sendall(b"done\n")  # the command, through exec
        channel.send_exit_status(0)
        channel.close()

    sshd.exec_handler = shell
    sshd.sftp_handler = sftp_with_the_runner
    ssh = connect(sshd)
    guest = LinuxGuest(ssh, runners=RunnerPool(SshRunnerLauncher(ssh, start_timeout=2)))
    before = rss_bytes()
    started = time.monotonic()
    result = guest.run("echo done", timeout=1)
    seconds = time.monotonic() - started
    assert result.exit_code == 0 and result.stdout == "done\n"
    assert seconds < 2 + 4, f"the first command took {seconds:.1f} s with a runner start bound of 2 s"
    assert sum(c.startswith("python3 ") for c in sshd.commands) == 1, sshd.commands
    assert guest.runner_off and guest.exec_runs == 1
    assert rss_bytes() - before < 50 * 1024 * 1024
    guest.close()
