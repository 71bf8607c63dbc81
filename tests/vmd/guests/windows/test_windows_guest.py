"""The Windows guest (vmd/guests/windows/: guest.py, verbs.py) against an SSH server on loopback
that answers like Windows' OpenSSH with PowerShell as its shell (tests/support/windows_ssh_server.py):
the exact command lines vmd sends, decoded and parsed as PowerShell, and Windows' answers
(CR LF, UTF-8, CLIXML) read back as the model must read them. No Windows runs here: no KVM,
no media; what the guest would do with each script is the scripts' own test's
(tests/vmd/guests/windows/test_windows_scripts.py) and the opt-in end-to-end test's."""

from __future__ import annotations

import re
import threading
import time

import paramiko

import pytest

from tests.vmd.guests.windows.test_windows_scripts import NOT_RECOGNIZED, PROGRESS, powershell_problems
from tests.support.windows_ssh_server import Exec, Reply, WindowsSshServer
from vmd.guests.families import guest_class
from vmd.guests.guest import GuestError, ShareLogin
from vmd.guests.ssh import SshConnection
from vmd.guests.windows import guest as windows_module
from vmd.guests.windows.guest import WindowsGuest
from vmd.guests.windows.scripts import EXIT_TAIL, TIMEOUT_LINE
from vmd.machines import screen_text as st


LOGIN = ShareLogin(user="vmd", password="Pw4ShareOnly")
NET_USE = "net.exe use Z: '\\\\10.0.2.4\\project' 'Pw4ShareOnly' ('/user:' + 'vmd') /persistent:no"


def _parses(script: str) -> None:
    problems = powershell_problems(script)
    if problems:
        raise ValueError(f"PowerShell could not parse it: {problems[:3]}")


class Guest:
    """A WindowsGuest on a fresh WindowsSshServer whose answers come from `answers`, a list
    of functions tried in order: the first that returns a Reply answers."""

    def __init__(self, tmp_path):
        self.answers = []
        self.server = WindowsSshServer(tmp_path / "guest", self._respond, _parses)

    def _respond(self, found: Exec) -> Reply:
        for answer in self.answers:
            reply = answer(found)
            if reply is not None:
                return reply
        return Reply()

    def __enter__(self):
        self.server.__enter__()
        self.guest = WindowsGuest(SshConnection("127.0.0.1", self.server.port, "agent", self.server.key_path))
        self.guest.share_login = LOGIN  # as the machine sets it from the share's account
        return self

    def __exit__(self, *exc):
        self.guest.close()
        self.server.__exit__(*exc)


@pytest.fixture
def win(tmp_path):
    with Guest(tmp_path) as guest:
        yield guest


def test_the_family_picks_the_windows_guest():
    assert guest_class("windows") is WindowsGuest and WindowsGuest.os_family == "windows"


def test_run_sends_the_wrapper_with_the_command_and_its_folder(win):
    command = "Get-ChildItem -Name; python -c \"print('h\u00e9')\""
    win.answers.append(lambda e: Reply(stdout="a.txt\r\nh\u00e9\r\n"))
    result = win.guest.run(command, timeout=42, cwd="src")
    [sent] = win.server.recorded.execs
    # The line runs the wrapper in sshd's own PowerShell: no powershell.exe of its own.
    assert not sent.line.lower().startswith("powershell") and "[ScriptBlock]::Create($vmdScript)" in sent.line
    assert sent.wrapper.count("powershell.exe") == 1  # the command's own, the one start left
    assert sent.cwd == "Z:\\src" and sent.seconds == 42
    assert sent.command == command + "\n" + EXIT_TAIL  # the exit code's tail, on a line of its own
    assert sent.command_file.startswith("C:\\vmd\\run\\") and sent.command_file.endswith(".ps1")
    for part in ("$ProgressPreference = 'SilentlyContinue'", "[Console]::OutputEncoding = [Text.Encoding]::UTF8",
                 "[VmdJob]::Assign($vmdJob, $vmdChild.Handle)", "[VmdJob]::Kill($vmdJob)",
                 "$vmdStart.RedirectStandardInput = $true", "$vmdChild.StandardInput.Close()",
                 NET_USE, "& net.exe use Z: /delete /y"):
        assert part in sent.wrapper
    # 5.1 turns net.exe's stderr under 2>&1 into error records: under 'Stop' one would end the wrapper.
    assert sent.wrapper.index("net.exe use") < sent.wrapper.index("$ErrorActionPreference = 'Stop'")
    assert "Set-Location -LiteralPath $vmdCwd" in sent.inner and "[ScriptBlock]::Create($vmdText)" in sent.inner
    assert result.exit_code == 0 and result.stdout == "a.txt\nh\u00e9\n" and not result.timed_out
    assert sent.stdin_closed  # no command waits on input vmd never sends
    assert win.guest.run("'x'").exit_code == 0 and win.server.recorded.execs[1].cwd == "Z:\\"


def test_output_past_the_bounds_keeps_its_head_and_tail(win):
    win.guest.output = type("Bounds", (), {"head": 100, "tail": 100})()  # what the machine sets from config
    win.answers.append(lambda e: Reply(stdout="".join(f"line {n}\r\n" for n in range(1000))))
    result = win.guest.run("1..1000 | ForEach-Object { 'line ' + $_ }")
    assert result.truncated and result.stdout.startswith("line 0\n") and result.stdout.endswith("line 999\n")
    assert "bytes of output cut here" in result.stdout and len(result.stdout) < 400


def test_exit_codes_come_back_as_the_guest_gave_them(win):
    win.answers.append(lambda e: Reply(stdout="fail\r\n", exit_code=3) if "exit 3" in e.command else None)
    win.answers.append(lambda e: Reply(exit_code=1) if "Get-Item nope" in e.command else None)
    assert win.guest.run("cmd /c exit 3").exit_code == 3
    assert win.guest.run("Get-Item nope").exit_code == 1
    assert win.guest.run("'fine'").exit_code == 0


def test_clixml_is_stripped_from_stderr_and_from_the_lines_watched(win):
    stderr = "#< CLIXML\r\n" + PROGRESS + "\r\n#< CLIXML\r\n" + NOT_RECOGNIZED + "\r\n"
    win.answers.append(lambda e: Reply(stdout="before\r\n", stderr=stderr, exit_code=1))
    seen = []
    result = win.guest.run("cargo build", on_output=lambda stream, line: seen.append((stream, line)))
    assert result.exit_code == 1 and "Objs" not in result.stderr and "Preparing modules" not in result.stderr
    assert result.stderr.startswith("cargo : The term 'cargo' is not recognized")
    assert "\r" not in result.stderr and "+ cargo build\n" in result.stderr
    assert ("stdout", "before") in seen
    assert ("stderr", "At line:1 char:1") in seen and not any("Objs" in line for _, line in seen)


def test_the_guests_timeout_kill_is_reported_as_a_timeout(win):
    win.answers.append(lambda e: Reply(stdout="partial\r\n", stderr=TIMEOUT_LINE + "\r\n", exit_code=124))
    result = win.guest.run("Start-Sleep 100", timeout=2)
    assert result.timed_out and result.exit_code == 124 and result.stdout == "partial\n"
    assert TIMEOUT_LINE not in result.stderr
    assert "ran past its 2 s timeout and was killed with everything it started" in result.stderr
    # A command that exits 124 itself did not time out.
    win.answers.insert(0, lambda e: Reply(exit_code=124) if "exit 124" in e.command else None)
    assert not win.guest.run("exit 124").timed_out


def test_a_guest_that_never_answers_is_given_up_on_after_the_timeout(win, monkeypatch):
    monkeypatch.setattr(windows_module, "HOST_GRACE_S", 0.5)
    win.answers.append(lambda e: Reply(delay=30))
    started = time.monotonic()
    result = win.guest.run("Start-Sleep 100", timeout=1)
    assert result.timed_out and result.exit_code == 124 and time.monotonic() - started < 5


@pytest.mark.parametrize("path, words", [
    ("con", "reserved device name on Windows (CON"),
    ("Z:\\src\\NUL.txt", "reserved device name on Windows (NUL"),
    ("logs/lpt9.log", "reserved device name on Windows (LPT9"),
    ("com1", "reserved device name"),
    ("notes.", "ends with a dot or a space"),
    ("Z:\\dir \\a.txt", "ends with a dot or a space"),
    ("what?.txt", "no Windows name may hold"),
    ("/home/agent/x", "is a Linux path; this guest is Windows"),
    ("\\\\server\\share\\x", "network (UNC) path"),
    ("C:relative.txt", "names a drive without a backslash"),
])
def test_names_windows_cannot_have_are_refused_before_any_sftp_request(win, path, words):
    for call in (lambda: win.guest.write_file(path, "x"), lambda: win.guest.read_file(path),
                 lambda: win.guest.append_file(path, "x"), lambda: win.guest.list_dir(path),
                 lambda: win.guest.run("'x'", cwd=path)):
        with pytest.raises(GuestError, match=re.escape(words)):
            call()
    assert win.server.recorded.sftp == [] and win.server.recorded.execs == []


def test_files_with_drive_letters_either_slash_and_any_case(win):
    assert win.guest.write_file("Z:/src/App.py", "print('hi')\r\n") == 13
    root = win.server.root
    assert (root / "Z" / "src" / "App.py").read_bytes() == b"print('hi')\r\n"
    assert win.guest.read_file("z:\\SRC\\app.py").content == "print('hi')\r\n"  # one file to Windows
    win.guest.append_file("src\\APP.PY", "# more")
    assert (root / "Z" / "src" / "App.py").read_text().endswith("# more")
    assert [(e.name, e.type) for e in win.guest.list_dir("Z:\\")] == [("src", "dir")]
    win.guest.write_file("C:\\Users\\agent\\notes\\a.txt", "a")
    assert (root / "C" / "Users" / "agent" / "notes" / "a.txt").read_text() == "a"
    assert ("mkdir", "/C:/Users") in win.server.recorded.sftp
    with pytest.raises(GuestError, match="no such file or folder in the guest"):
        win.guest.read_file("Z:\\missing.txt")
    win.guest.edit_file("src/app.py", "hi", "bye")
    assert "bye" in (root / "Z" / "src" / "App.py").read_text()


def _task_runs(found: Exec) -> bool:
    return "schtasks.exe /Run /TN 'vmd-launch'" in found.command


def test_launch_app_asks_the_desktop_sessions_task(win):
    win.guest._desktop_mapped = True  # the drive is mapped there already (the next test's)
    win.answers.append(lambda e: Reply(stdout="SUCCESS: Attempted to run the scheduled task \"vmd-launch\".\r\n")
                       if _task_runs(e) else None)
    text = win.guest.launch_app("C:\\Program Files\\App\\app.exe", ["--open", "a&b.txt", "plain"])
    request = (win.server.root / "C" / "vmd" / "launch.txt").read_bytes()
    assert request == '\ufeff"C:\\Program Files\\App\\app.exe" --open "a&b.txt" plain'.encode("utf-8")
    assert text.startswith("asked the desktop session to start C:\\Program Files\\App\\app.exe")
    assert [e.cwd for e in win.server.recorded.execs] == ["C:\\"]
    with pytest.raises(GuestError, match="cannot pass '%PATH%' on Windows"):
        win.guest.launch_app("notepad.exe", ["%PATH%"])
    win.answers.insert(0, lambda e: Reply(stderr="ERROR: The system cannot find the file specified.\r\n",
                                          exit_code=1) if _task_runs(e) else None)
    with pytest.raises(GuestError, match="could not start notepad.exe: the desktop session's task did not run "
                                         r"\(exit 1: ERROR: The system cannot find the file specified.\)"):
        win.guest.launch_app("notepad.exe", [])


# What LIST_WINDOWS writes on a Windows 11 desktop with Notepad in front of an Explorer window
# (handles are decimal HWNDs; frame: left, right, top, bottom).
LISTING = ("@@active 132456\r\n"
           "132456\t208\t151\t964\t563\t8,8,51,8\tUntitled - Notepad\r\n"
           "66310\t40\t40\t1200\t700\t1,1,31,1\tDocuments - File Explorer\r\n"
           "99\t0\t0\t1280\t752\t0,0,0,0\tProgram Manager\r\n"
           "77\t1" + "0" * 400 + "\t5\t100\t100\t0,0,0,0\thostile\r\n"
           "78\t5\t5\t3\t3\t0,0,0,0\ttiny\r\n")


def test_list_windows_is_read_in_the_desktop_session_and_parsed(win):
    def the_task_lists(found: Exec):
        if not _task_runs(found):
            return None
        line = (win.server.root / "C" / "vmd" / "launch.txt").read_bytes().decode("utf-8-sig")
        out = line.split(" -Out ")[1]
        script = line.split(" -File ")[1].split(" -Out ")[0]
        assert line.startswith("powershell.exe -NoProfile -NonInteractive -WindowStyle Hidden")
        assert powershell_problems(win.server.files_path(script).read_text(encoding="utf-8-sig")) == []
        win.server.files_path(out).write_text(LISTING, encoding="utf-8")
        return Reply(stdout="SUCCESS\r\n")

    win.answers.append(the_task_lists)
    windows = win.guest.list_windows()
    assert [(w.title, w.x, w.y, w.width, w.height, w.active, w.frame) for w in windows] == [
        ("Untitled - Notepad", 208, 151, 964, 563, True, (8, 8, 51, 8)),
        ("Documents - File Explorer", 40, 40, 1200, 700, False, (1, 1, 31, 1)),
        ("Program Manager", 0, 0, 1280, 752, False, (0, 0, 0, 0))]
    left = [p.name for p in (win.server.root / "C" / "vmd" / "run").iterdir() if p.name.startswith("windows-")]
    assert left == []  # the script and its list are removed
    # The screenshot's text gets them through the same seam as a Linux guest's, scaled.
    shown, why = st.guest_windows(win.guest, 0.5, (640, 376))
    assert why == "" and [(w.title, w.x, w.y, w.width, w.active) for w in shown][:2] == [
        ("Untitled - Notepad", 104, 76, 482, True), ("Documents - File Explorer", 20, 20, 600, False)]
    listing = st.describe(640, 376, [st.Word("Untitled", 120, 60, 50, 10, 95.0)], shown)
    assert 'Window "Untitled - Notepad" at (104, 76) 482x282, centre (345, 217), focused:' in listing


def test_list_windows_says_what_went_wrong_in_the_session(win):
    def the_task_fails(found: Exec):
        if not _task_runs(found):
            return None
        out = (win.server.root / "C" / "vmd" / "launch.txt").read_bytes().decode("utf-8-sig").split(" -Out ")[1]
        win.server.files_path(out).write_text("@@error Access is denied.\r\n", encoding="utf-8")
        return Reply(stdout="SUCCESS\r\n")

    win.answers.append(the_task_fails)
    with pytest.raises(GuestError, match="the desktop session could not list its windows: Access is denied."):
        win.guest.list_windows()


def test_list_windows_says_when_the_session_wrote_nothing(win, monkeypatch):
    monkeypatch.setattr("vmd.guests.windows.verbs.WINDOWS_WAIT_S", 0.5)
    win.answers.append(lambda e: Reply(stdout="SUCCESS\r\n") if _task_runs(e) else None)
    with pytest.raises(GuestError, match="the desktop session wrote no window list within 0.5 s"):
        win.guest.list_windows()


FACTS = ("os=Microsoft Windows 11 Pro (Professional)\r\nbuild=10.0.22631.4460\r\npowershell=5.1.22621.4391\r\n"
         "python=Python 3.12.7\r\ngit=git version 2.47.0.windows.2\r\ndotnet=none\r\ndesktop=True\r\n"
         "mounted=True\r\nboot=2026-12-02T08:01:12.5000000Z\r\nhostname=VMAGENT-WIN\r\n")


def test_facts_desktop_and_internet_probes_read_their_answers(win):
    win.answers.append(lambda e: Reply(stdout=FACTS) if "'os=' + $os.Caption" in e.command else None)
    win.answers.append(lambda e: Reply(stdout="explorer.exe is not running in a user session yet\r\n", exit_code=1)
                       if "Get-Process -Name explorer" in e.command else None)
    win.answers.append(lambda e: Reply(stdout="no TCP connection to example.com:80 within 8 s\r\n", exit_code=1)
                       if "TcpClient" in e.command else None)
    facts = win.guest.facts()
    assert facts.os == "Microsoft Windows 11 Pro (Professional)"
    assert facts.kernel == "Windows 10.0.22631.4460; PowerShell 5.1.22621.4391; dotnet none"
    assert (facts.python, facts.git, facts.desktop, facts.project_mounted, facts.hostname) == (
        "Python 3.12.7", "git version 2.47.0.windows.2", True, True, "VMAGENT-WIN")
    assert win.guest.desktop_problem() == "explorer.exe is not running in a user session yet"
    assert win.guest.check_internet("example.com") == (False, "no TCP connection to example.com:80 within 8 s")
    probe = win.server.recorded.execs[-1].command
    assert "ConnectAsync('example.com', 80)" in probe
    win.answers.insert(0, lambda e: Reply(stdout="garbage\r\n") if "'os='" in e.command else None)
    with pytest.raises(GuestError, match="could not read facts from the Windows guest"):
        win.guest.facts()


def _new_identity(win, restart_after: float | None):
    """Answers NEW_IDENTITY as Windows would, and restarts the fake's sshd with the new key
    `restart_after` s later (as the script's SYSTEM task does; None: never)."""
    new_key = paramiko.RSAKey.generate(1024)

    def answer(found: Exec):
        if "'MachineGuid'" not in found.command:
            return None
        if restart_after is not None:
            threading.Timer(restart_after, lambda: setattr(win.server, "host_key", new_key)).start()
        return Reply(stdout=f"key=ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKm9 root@VMAGENT-WIN\r\n"
                            f"key=ssh-rsa {new_key.get_base64()} root@VMAGENT-WIN\r\n")
    win.answers.append(answer)
    return new_key


def test_a_warm_slot_gets_new_host_keys_and_is_saved_only_once_sshd_serves_them(win):
    win.guest.identity_wait_s = 20
    new_key = _new_identity(win, restart_after=1.5)
    started = time.monotonic()
    win.guest.forget_identity()
    assert time.monotonic() - started >= 1.5  # the old key's sshd was not taken for the new one
    script = win.server.recorded.execs[0].command
    for part in ("Get-ChildItem -LiteralPath $dir -Filter 'ssh_host_*' | Remove-Item -Force", "& $keygen -A",
                 "/grant '*S-1-5-18:F' /grant '*S-1-5-32-544:F'", "-Name 'MachineGuid'",
                 "Restart-Service -Name sshd -Force", "-User 'SYSTEM'"):
        assert part in script, part
    assert win.server.recorded.connections >= 3  # the guest's, the old key's probe, the new key's
    probe = SshConnection("127.0.0.1", win.server.port, "agent", win.server.key_path)
    assert probe.transport().get_remote_server_key().get_base64() == new_key.get_base64()
    probe.close()


def test_a_slot_whose_sshd_never_serves_its_new_keys_is_not_saved(win):
    win.guest.identity_wait_s = 2
    _new_identity(win, restart_after=None)
    with pytest.raises(GuestError, match=r"sshd did not come back with its new host keys within 2 s "
                                         r"\(last: the old host key\)"):
        win.guest.forget_identity()


def test_a_guest_that_cannot_take_a_new_identity_says_why(win):
    win.answers.append(lambda e: Reply(stderr="vmd-identity: there is no sshd service\r\n", exit_code=1)
                       if "'MachineGuid'" in e.command else None)
    with pytest.raises(GuestError, match="could not take a new identity: vmd-identity: there is no sshd service"):
        win.guest.forget_identity()
    win.answers.insert(0, lambda e: Reply(stdout="\r\n") if "'MachineGuid'" in e.command else None)
    with pytest.raises(GuestError, match="listed no new sshd host key"):
        win.guest.forget_identity()


def _desktop_task(win, ran: list[str]):
    """The session task as Windows runs it: the script launch.txt names runs in the desktop
    session; a share script removes itself first (REMAP_SHARE), which is what vmd waits for."""
    def answer(found: Exec):
        if not _task_runs(found):
            return None
        line = (win.server.root / "C" / "vmd" / "launch.txt").read_bytes().decode("utf-8-sig")
        if " -File " in line and "share-" in line:
            script = win.server.files_path(line.split(" -File ")[1])
            ran.append(script.read_bytes().decode("utf-8-sig"))
            script.unlink()
        return Reply(stdout="SUCCESS: Attempted to run the scheduled task \"vmd-launch\".\r\n")
    return answer


def test_the_share_is_mapped_with_its_login_and_checked_in_sshd_and_the_desktop(win):
    # sshd's key logons have no credentials for the network: the mapping names the share's
    # user and password, and the machine hears whether it held.
    (win.server.root / "C" / "vmd" / "run").mkdir(parents=True)
    ran = []
    win.answers.append(_desktop_task(win, ran))
    assert win.guest.mount_share() is None
    mount = win.server.recorded.execs[0].command
    assert mount.startswith("if (Test-Path -LiteralPath 'Z:\\') { 'mapped'; exit 0 }") and NET_USE in mount
    [script] = ran
    assert script.startswith("Remove-Item -LiteralPath $MyInvocation.MyCommand.Path")  # its password first
    assert NET_USE in script and "& net.exe use '\\\\10.0.2.4\\project' /delete /y" in script
    assert powershell_problems(script) == []
    assert not list((win.server.root / "C" / "vmd" / "run").iterdir())  # no password left on the guest's disk
    # A launch_app after it needs no new mapping; one after a failed mapping tries again.
    win.guest.launch_app("notepad.exe", [])
    assert len(ran) == 1


def test_a_share_that_does_not_map_says_what_net_use_said(win, monkeypatch):
    from vmd.guests.windows import verbs as windows_verbs
    monkeypatch.setattr(windows_verbs, "REMAP_WAIT_S", 0.5)
    (win.server.root / "C" / "vmd" / "run").mkdir(parents=True)
    win.answers.append(lambda e: Reply(stderr="net use exited 2: System error 1326 has occurred. The user name or "
                                              "password is incorrect.\r\n", exit_code=1)
                       if "'mapped'; exit 0" in e.command else None)
    win.answers.append(lambda e: Reply(stdout="SUCCESS\r\n") if _task_runs(e) else None)  # but nobody ran it
    said = win.guest.mount_share()
    assert "System error 1326" in said and "password is incorrect" in said
    assert "Pw4ShareOnly" not in said
    # The desktop's script that no task ran is not left behind with the password in it.
    assert not list((win.server.root / "C" / "vmd" / "run").iterdir())
    assert not win.guest._desktop_mapped


def test_a_restored_guest_maps_the_project_drive_anew_in_the_desktop_session_too(win):
    # A warm slot's desktop mapped Z: to the slot's placeholder share with the slot's login,
    # over a connection the save ended: the restore maps it anew there, with the session's.
    (win.server.root / "C" / "vmd" / "run").mkdir(parents=True)
    ran = []
    win.answers.append(lambda e: Reply(stdout=FACTS) if "'os=' + $os.Caption" in e.command else None)
    win.answers.append(_desktop_task(win, ran))
    win.guest._desktop_mapped = True  # the slot's own mapping, before its save
    facts = win.guest.restored(1764662400.0, mount_share=True)
    assert facts.hostname == "VMAGENT-WIN"
    clock, mount, task = (e.command for e in win.server.recorded.execs[:3])
    assert "FromUnixTimeMilliseconds(1764662400000)" in clock
    assert NET_USE in mount
    assert _task_runs(win.server.recorded.execs[2])
    line = (win.server.root / "C" / "vmd" / "launch.txt").read_bytes().decode("utf-8-sig")
    assert line.startswith("powershell.exe -NoProfile -NonInteractive -WindowStyle Hidden -ExecutionPolicy Bypass "
                           "-File C:\\vmd\\run\\share-")
    [script] = ran
    assert "& net.exe use Z: /delete /y" in script and NET_USE in script
    assert powershell_problems(script) == []


def test_sftp_on_the_project_drive_maps_it_first_in_each_new_ssh_logon(win):
    # SFTP runs in the SSH connection's own logon, where Z: exists only once mapped there: a
    # connection vmd opens anew (after a question's wait) maps it before its first request.
    def maps(found: Exec) -> bool:
        return "'mapped'; exit 0" in found.command and NET_USE in found.command

    win.guest.write_file("Z:\\a.txt", "first")
    win.guest.write_file("Z:\\src\\b.txt", "second")
    assert sum(maps(e) for e in win.server.recorded.execs) == 1
    win.guest.ssh.close()  # the suspend before a question closes it; the resume reconnects
    assert win.guest.read_file("Z:\\a.txt").content == "first"
    assert sum(maps(e) for e in win.server.recorded.execs) == 2
    assert win.server.recorded.execs[-1].connection == win.server.recorded.connections  # the new logon's
    win.guest.write_file("C:\\Users\\agent\\c.txt", "not on the share")
    assert sum(maps(e) for e in win.server.recorded.execs) == 2
