"""Guest and model text in vmd's own words: an error reply's message and vmd's log lines
carry it as data, never as escape sequences for the operator's terminal (OSC 52 writes
the clipboard, OSC 0 the title, CSI rewrites the screen) and never as forged log lines."""

from __future__ import annotations

import io
import logging

import pytest

import vmd.server.rpc  # noqa: F401  (vmd's server: it makes vmd's log records printable)
from tests.support.hostile_sshd import HANDLE, OPENDIR, HostileSshd, packet, string, u32
from tests.support.vmd_fakes import RpcClient, RpcError, local_vmd
from vmd.guests.guest import GuestError
from vmd.guests.linux.guest import LinuxGuest
from vmd.guests.ssh import SshConnection

EVIL = "\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2J\x9b1mboom\r\nvmd: FAKE LINE"


def _shown(text: str) -> None:
    assert not any(c in text for c in "\x1b\x07\r\x9b"), repr(text)


def test_an_error_reply_carries_guest_and_model_text_without_escapes(tmp_path):
    with local_vmd(tmp_path) as (_, _, config):
        with RpcClient(config.socket) as c:
            c.call("session_open", os="debian", project="escapes", task="t")
            c.call("plan_tasks", tasks=["t"])
            c.call("session_ready", timeout=30)
            name = f"notes-{EVIL}.txt"
            c.call("write_file", path=name, content="hello\n")
            with pytest.raises(RpcError) as err:  # a GuestError that names the path
                c.call("edit_file", path=name, old="absent", new="x")
            with pytest.raises(RpcError) as bad:  # a param's name the model made up
                c.call("run", command="true", **{EVIL: 1})
    for message in (err.value.message, bad.value.message):
        _shown(message)
        assert "boom" in message and "FAKE LINE" in message  # the text is kept, as data


def test_an_sftp_servers_status_text_reaches_the_error_as_one_printable_line(tmp_path):
    sshd = HostileSshd(tmp_path)

    def handle(kind, request_id, body):
        # STATUS failure (4) with the guest's own message
        yield packet(101, u32(request_id) + u32(4) + string(EVIL.encode() * 100) + string(b""))

    sshd.sftp_handler = handle
    guest = LinuxGuest(SshConnection("127.0.0.1", sshd.port, "agent", str(sshd.key_path)), use_runner=False)
    try:
        with pytest.raises(GuestError) as err:
            guest.list_dir("/mnt/project")
    finally:
        guest.close()
        sshd.close()
    message = str(err.value)
    _shown(message)
    assert "\n" not in message and len(message) < 600 and "boom" in message


def test_vmds_log_lines_are_one_printable_line_and_tracebacks_printable():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    log = logging.getLogger("vmd.test_shown_text")
    log.addHandler(handler)
    try:
        log.warning("the guest at %s said %r and %s", EVIL, 1, EVIL)
        try:
            raise RuntimeError(EVIL)
        except RuntimeError:
            log.exception("the reaper failed on %s", EVIL)
    finally:
        log.removeHandler(handler)
    text = out.getvalue()
    _shown(text)
    first, second = text.split("\n", 2)[:2]
    assert first.startswith("vmd.test_shown_text: the guest at ") and "FAKE LINE" in first
    assert second.startswith("vmd.test_shown_text: the reaper failed on ")
    assert "Traceback" in text and "RuntimeError" in text


def test_other_loggers_are_left_as_they_are():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    log = logging.getLogger("vmagent_test_other")
    log.addHandler(handler)
    try:
        log.warning("a\tb")
    finally:
        log.removeHandler(handler)
    assert out.getvalue() == "a\tb\n"
