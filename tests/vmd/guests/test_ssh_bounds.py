"""A guest that stops answering SSH requests (QEMU paused it: its disk could not grow on a
full host disk) must not hold vmd: every request is bounded, and close() does not wait.

The guest here is a real SSH server (paramiko's, in this process) whose request handling
hangs once `hang` is set, the way a paused guest's sshd never answers: the TCP connection
stays up, nothing comes back.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import paramiko
import pytest

from vmd.guests.guest import GuestError
from vmd.guests.linux.guest import LinuxGuest
from vmd.guests.ssh import GuestNotAnswering, SshConnection


class _HangingServer(paramiko.ServerInterface):
    """Its callbacks run on the server transport's own thread: one that waits stops that
    connection whole, as a paused guest's sshd does."""

    def __init__(self, hang: threading.Event, open_hang: threading.Event, release: threading.Event):
        self.hang, self.open_hang, self.release = hang, open_hang, release

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        if self.open_hang.is_set():
            self.release.wait(60)
        return paramiko.OPEN_SUCCEEDED

    def _request(self) -> bool:
        if self.hang.is_set():
            self.release.wait(60)
        return False  # nothing runs here; only the answer's timing matters

    def check_channel_exec_request(self, channel, command):
        return self._request()

    def check_channel_subsystem_request(self, channel, name):
        return self._request()


@pytest.fixture
def guest_sshd(tmp_path):
    """(host, port, key path, hang, hang_on_open): set `hang` and the server stops answering
    requests on channels; set `hang_on_open` too and it stops answering channel opens."""
    key_path = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_path)], check=True)
    host_key = paramiko.RSAKey.generate(1024)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    hang, release, open_hang = threading.Event(), threading.Event(), threading.Event()
    transports = []

    def serve():
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(sock)
            transport.add_server_key(host_key)
            transport.start_server(server=_HangingServer(hang, open_hang, release))
            transports.append(transport)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield "127.0.0.1", listener.getsockname()[1], str(key_path), hang, open_hang
    finally:
        release.set()
        listener.close()
        for transport in transports:
            transport.close()


@pytest.mark.parametrize("stops_at, says", [
    ("exec", "did not start a command within 1 s"),  # the channel opens, the exec gets no answer
    ("open", "did not open an SSH channel within 1 s"),  # the channel's open gets none
])
def test_a_request_the_guest_never_answers_fails_in_its_time(guest_sshd, stops_at, says):
    host, port, key, hang, open_hang = guest_sshd
    ssh = SshConnection(host, port, "agent", key)
    ssh.transport()
    (hang if stops_at == "exec" else open_hang).set()
    started = time.monotonic()
    with pytest.raises(GuestNotAnswering, match=says):
        ssh.open_channel(command="true", timeout=1)
    assert time.monotonic() - started < 5
    ssh.close()


def test_a_file_verb_on_a_guest_that_stopped_answering_says_so_and_close_does_not_wait(guest_sshd):
    """The SFTP start hangs; a close() meanwhile (the session's end, from the reaper)
    returns at once, and the file verb waiting on the guest ends with it, long before its
    own request_timeout, with a sentence for the model."""
    host, port, key, hang, _ = guest_sshd
    ssh = SshConnection(host, port, "agent", key)
    ssh.request_timeout = 30  # far above what the close must take: the close ends the wait
    ssh.transport()
    hang.set()
    guest = LinuxGuest(ssh, use_runner=False)
    outcome: dict = {}

    def read():
        started = time.monotonic()
        try:
            guest.read_file("notes.txt")
        except GuestError as exc:
            outcome["error"] = str(exc)
        except Exception as exc:  # what paramiko raised got past the verb: the model gets no answer
            outcome["error"] = repr(exc)
        outcome["seconds"] = time.monotonic() - started

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.5)  # the reader waits on the guest now
    started = time.monotonic()
    ssh.close()
    assert time.monotonic() - started < 5, "close() waited on the guest"
    reader.join(20)
    assert not reader.is_alive(), "the file verb still waits on a guest that stopped answering"
    assert outcome["seconds"] < 15, outcome
    assert outcome["error"].startswith("read_file /mnt/project/notes.txt: "), outcome


def test_a_connection_closed_under_a_file_verb_is_a_sentence_not_an_eof():
    """paramiko raises EOFError (not an OSError) from a call whose connection was closed
    under it; seen in CI under load as the reader above dying with no answer at all."""

    class ClosedSsh:
        user = "agent"
        sftp_reply_timeout = 5.0

        def sftp(self):
            raise EOFError()

    guest = LinuxGuest(ClosedSsh(), use_runner=False)
    with pytest.raises(GuestError, match="read_file /mnt/project/notes.txt: the connection to the guest closed"):
        guest.read_file("notes.txt")
    with pytest.raises(GuestError, match="write_file /mnt/project/notes.txt: the connection to the guest closed"):
        guest.write_file("notes.txt", "x")
