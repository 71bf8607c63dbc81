"""The guest runner (vmd/guests/linux/in_guest/runner.py) and its host end (vmd/guests/linux/runner_link.py), without a
guest: the runner runs here as a local process and `LinuxGuest` drives it through a
stand-in channel over the process's pipes. A fake runner plays the attacker: malformed
frames and a runner that dies must end the command with a clear error, never hang it,
never run it twice. The same code on a real guest: tests/vmd/machines/test_machine_vm.py."""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vmd.guests.guest import GuestError
from vmd.guests.linux.guest import LinuxGuest
from vmd.guests.linux.runner_link import (RUNNER_PATH, RUNNER_SHA256, RUNNER_SOURCE, RunnerDeadline, RunnerLink,
                                          RunnerLost, RunnerPool, RunnerUnavailable, SshRunnerLauncher)

RUNNER = Path(__file__).resolve().parents[4] / "vmd" / "guests" / "linux" / "in_guest" / "runner.py"


class PipeTransport:
    """A runner's channel stood in for by the pipes of a local process."""

    def __init__(self, argv: list[str], env: dict, cwd: str):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, cwd=cwd)
        self.out = self.proc.stdout.fileno()
        self._lock = threading.Lock()

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self.out], [], [], max(0.0, timeout))
        if not ready:
            return None
        return os.read(self.out, 262144)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def describe(self) -> str:
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            return "still running"
        return f"exit status {self.proc.returncode}; {self.proc.stderr.read()[-300:].decode(errors='replace')}"

    def close(self) -> None:
        """Closes the runner's stdin (the host going away) at once, as a channel's close
        does; a runner that does not end by itself within 10 s is killed."""
        with self._lock:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class FakeChannel:
    """Enough of a paramiko channel for the exec path: the command ends at once with 0."""

    def __init__(self, log: list[str]):
        self.log = log
        self.status_event = threading.Event()
        self.status_event.set()

    def exec_command(self, command: str) -> None:
        self.log.append(command)

    def recv_ready(self):
        return False

    recv_stderr_ready = recv_ready

    def exit_status_ready(self):
        return True

    def recv_exit_status(self):
        return 0

    def close(self):
        pass


class FakeSsh:
    """The SSH connection of a guest with no SSH: exec'd commands are only recorded."""

    host, port, user = "127.0.0.1", 0, "agent"

    def __init__(self, sftp=None):
        self.exec_log: list[str] = []
        self._sftp = sftp

    def active(self) -> bool:
        return True

    def open_channel(self, command=None, subsystem=None, timeout=30):
        channel = FakeChannel(self.exec_log)
        channel.exec_command(command)
        return channel

    def drop_sftp(self) -> None:
        pass

    def sftp(self):
        if self._sftp is None:
            raise OSError("no SFTP here")
        return self._sftp

    def close(self) -> None:
        pass


@pytest.fixture
def home(tmp_path):
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def runner_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VMD_RUN", "LANG", "LC_ALL", "LC_CTYPE", "PYTHONPATH")}
    env["HOME"] = str(home)
    return env


def local_link(home: Path, script: Path = RUNNER, *args: str, expected: str = RUNNER_SHA256) -> RunnerLink:
    transport = PipeTransport([sys.executable, "-I", "-S", "-u", str(script), *args], runner_env(home), str(home))
    link = RunnerLink(transport, expected)
    link.hello(20)
    return link


def local_guest(tmp_path: Path, home: Path, launch=None, **kwargs) -> LinuxGuest:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    pool = RunnerPool(launch or (lambda: local_link(home)))
    return LinuxGuest(FakeSsh(), str(project), runners=pool, **kwargs)


@pytest.fixture
def guest(tmp_path, home):
    guest = local_guest(tmp_path, home)
    yield guest
    guest.runners.close()


def gone(pid: int) -> bool:
    """The process ended (a zombie no one reaped yet counts: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# --- the runner ----------------------------------------------------------------------------


def test_commands_go_through_one_runner_and_their_exit_codes_come_back(guest):
    assert guest.run("true").exit_code == 0
    assert guest.run("exit 3").exit_code == 3
    assert guest.run("exit 124").timed_out is False  # the command's own 124 is no timeout
    killed = guest.run("kill -9 $$")
    assert killed.exit_code == 137 and "Killed" in killed.stderr  # 128 + signal, as bash says
    assert guest.run("kill -TERM $$").exit_code == 143
    assert guest.run("sleep 0.1").exit_code == 0
    assert guest.runner_runs == 6 and guest.exec_runs == 0 and guest.runners.started == 1
    assert not guest.ssh.exec_log


def test_stdout_and_stderr_stay_apart_and_lines_come_live_in_order(guest):
    lines: list[tuple[str, str]] = []
    result = guest.run("for i in 1 2 3; do echo out$i; echo err$i >&2; done; printf tail",
                       on_output=lambda stream, line: lines.append((stream, line)))
    assert result.stdout == "out1\nout2\nout3\ntail"
    assert result.stderr == "err1\nerr2\nerr3\n"
    assert [line for stream, line in lines if stream == "stdout"] == ["out1", "out2", "out3", "tail"]
    assert [line for stream, line in lines if stream == "stderr"] == ["err1", "err2", "err3"]


def test_a_progress_line_without_newline_shows_while_the_command_runs(guest):
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    result = guest.run("printf '%5000s' '' | tr ' ' p; sleep 1.5; echo; echo done",
                       on_output=lambda stream, line: seen.append((time.monotonic() - started, line)))
    assert result.exit_code == 0
    first_at, first = seen[0]
    assert set(first) == {"p"} and len(first) > 4096
    assert first_at < result.duration - 1.0, "the progress line came only at the end"
    assert seen[-1][1] == "done"


def test_five_megabytes_come_back_capped_with_head_and_tail(guest):
    script = "import sys; print('FIRST-LINE'); sys.stdout.write('x' * 5_000_000 + '\\n'); print('LAST-LINE')"
    lines: list[str] = []
    result = guest.run(f"{sys.executable} -c \"{script}\"", timeout=60,
                       on_output=lambda stream, line: lines.append(line))
    assert result.exit_code == 0 and result.truncated
    assert result.stdout.startswith("FIRST-LINE") and result.stdout.rstrip().endswith("LAST-LINE")
    assert "bytes of output cut here" in result.stdout and len(result.stdout) < 100_000
    assert lines[0] == "FIRST-LINE" and lines[-1] == "LAST-LINE"


def test_a_timeout_kills_the_group_and_a_setsid_daemon(guest, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    command = ("sleep 600 & echo $! > group.pid; "
               "setsid bash -c 'echo $$ > daemon.pid; exec sleep 601' & "
               "sleep 602")
    result = guest.run(command, timeout=2, cwd=str(work))
    assert result.timed_out and result.exit_code == 124
    assert "ran past its 2 s timeout" in result.stderr
    assert 2 <= result.duration < 8
    for name in ("group.pid", "daemon.pid"):
        pid = int((work / name).read_text())
        assert gone(pid), f"{name}: process {pid} outlived its timeout"
    assert not guest.ssh.exec_log, "the runner killed them itself; no exec was needed"


def test_a_command_that_ignores_sigterm_is_killed_three_seconds_later(guest):
    result = guest.run("trap '' TERM; sleep 30", timeout=1)
    assert result.timed_out and result.exit_code == 124
    assert 3.5 < result.duration < 8


def test_cwd_falls_back_to_the_home_folder_and_the_environment_carries_the_marker(guest, home, tmp_path):
    assert guest.run("pwd").stdout.strip() == str(tmp_path / "project")  # the project by default
    assert guest.run("pwd", cwd=str(tmp_path)).stdout.strip() == str(tmp_path)
    assert guest.run("pwd", cwd="/nonexistent/folder").stdout.strip() == str(home)  # cd … || cd ~
    env = dict(line.split("=", 1) for line in guest.run("env").stdout.splitlines() if "=" in line)
    assert len(env["VMD_RUN"]) == 32
    assert env["PWD"] == str(tmp_path / "project")
    assert "LC_CTYPE" not in env  # Python's own locale coercion does not leak into commands
    assert guest.run("cat; echo end").stdout == "end\n"  # stdin is /dev/null


def test_a_command_bash_cannot_be_given_fails_alone_and_the_runner_carries_on(guest):
    nul = guest.run("echo a\0b")
    assert nul.exit_code == 127 and "could not start bash" in nul.stderr
    surrogate = guest.run("echo \ud800")
    assert surrogate.exit_code == 127 and "vmd runner" in surrogate.stderr
    assert guest.run("echo still").stdout == "still\n"
    assert guest.runners.started == 1


def test_two_commands_at_once_each_get_a_runner(guest):
    results: dict[str, object] = {}

    def work(name):
        results[name] = guest.run(f"sleep 1; echo {name}")

    guest.run("true")  # one runner idle: the second command must start another
    started = time.monotonic()
    threads = [threading.Thread(target=work, args=(name,)) for name in ("alpha", "beta")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - started < 2.5, "the two commands ran one after the other"
    assert results["alpha"].stdout == "alpha\n" and results["beta"].stdout == "beta\n"
    assert guest.runners.started == 2 and guest.runner_runs == 3
    assert len(guest.runners.idle) == 2


def test_a_runner_that_dies_mid_command_loses_the_result_and_does_not_run_it_again(guest, home):
    with pytest.raises(GuestError, match="result is lost and vmd did not run it again"):
        guest.run("echo ran >> count; kill -9 $PPID; sleep 2", cwd=str(home))
    assert (home / "count").read_text() == "ran\n"  # the command ran once, and only once
    assert any("VMD_RUN=" in command for command in guest.ssh.exec_log)  # what it left is killed
    assert guest.run("echo again").stdout == "again\n"  # the next command gets a fresh runner
    assert guest.runners.started == 2


def test_the_host_going_away_kills_the_running_command(home):
    link = local_link(home)
    errors = []

    def run():
        try:
            link.run("sleep 600 & echo $! > bg.pid; wait", str(home), 60, "a" * 32,
                     lambda stream, data: None, time.monotonic() + 60)
        except RunnerLost as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    pid_file = home / "bg.pid"
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    link.transport.close()  # stdin closes, as when the SSH channel goes
    thread.join(15)
    assert errors and "stopped while the command ran" in str(errors[0])
    assert gone(int(pid_file.read_text()))


def test_a_runner_of_another_version_is_refused(home):
    with pytest.raises(RunnerUnavailable, match="not the one vmd sent"):
        local_link(home, expected="0" * 64)


# --- a hostile runner ---------------------------------------------------------------------

FAKE_RUNNER = r'''
import json, os, struct, sys, time
H = struct.Struct(">cI")
def frame(kind, payload):
    os.write(1, H.pack(kind, len(payload)) + payload)
mode, sha = sys.argv[1], sys.argv[2]
frame(b"H", json.dumps({"sha256": sha, "pid": os.getpid()}).encode())
request = json.loads(sys.stdin.readline())
rid = request["id"]
frame(b"O", b"some output\n")
if mode == "unknown":
    frame(b"Z", b"abc")
elif mode == "huge":
    os.write(1, H.pack(b"O", 0xFFFFFFFF) + b"x" * 100)
elif mode == "notjson":
    frame(b"X", b"{not json")
elif mode == "deep":
    frame(b"X", b"[" * 2000 + b"]" * 2000)
elif mode == "wrongid":
    frame(b"X", json.dumps({"id": rid + 1, "exit_code": 0, "timed_out": False}).encode())
elif mode == "badcode":
    frame(b"X", json.dumps({"id": rid, "exit_code": 100000, "timed_out": False}).encode())
elif mode == "boolcode":
    frame(b"X", json.dumps({"id": rid, "exit_code": True, "timed_out": False}).encode())
elif mode == "hello-again":
    frame(b"H", b"{}")
elif mode == "cut":
    os.write(1, H.pack(b"O", 1000) + b"half")
    sys.exit(3)
elif mode == "silent":
    sys.stdin.read()
sys.stdin.read()
'''


@pytest.fixture
def fake_runner(tmp_path):
    path = tmp_path / "fake_runner.py"
    path.write_text(FAKE_RUNNER)
    return path


@pytest.mark.parametrize("mode, says", [
    ("unknown", "unknown type"),
    ("huge", "4294967295 bytes"),
    ("notjson", "not JSON"),
    ("deep", "not JSON"),
    ("wrongid", "does not fit"),
    ("badcode", "does not fit"),
    ("boolcode", "does not fit"),
    ("hello-again", "while a command ran"),
    ("cut", "stopped while the command ran"),
])
def test_a_malformed_reply_ends_the_command_with_a_clear_error_at_once(tmp_path, home, fake_runner, mode, says):
    links = iter([lambda: local_link(home, fake_runner, mode, "f" * 64, expected="f" * 64),
                  lambda: local_link(home)])
    guest = local_guest(tmp_path, home, launch=lambda: next(links)())
    started = time.monotonic()
    with pytest.raises(GuestError, match="result is lost") as caught:
        guest.run("echo hello")
    assert says in str(caught.value)
    assert time.monotonic() - started < 12, "a malformed reply kept the command waiting"
    assert guest.run("echo fresh").stdout == "fresh\n"  # the broken runner was replaced
    assert guest.runners.started == 2
    guest.runners.close()


def test_a_runner_that_never_answers_meets_the_hosts_deadline(home, fake_runner):
    link = local_link(home, fake_runner, "silent", "f" * 64, expected="f" * 64)
    started = time.monotonic()
    with pytest.raises(RunnerDeadline):
        link.run("true", str(home), 1, "b" * 32, lambda stream, data: None, time.monotonic() + 1.5)
    assert 1.4 < time.monotonic() - started < 5
    assert link.broken and not link.usable()


def test_a_runner_that_speaks_out_of_turn_is_not_reused(home, fake_runner):
    link = local_link(home)
    link.transport.proc.stdin.write(b'{"id": 0, "command": "true", "cwd": "/", "timeout": 5, "marker": "c"}\n')
    link.transport.proc.stdin.flush()
    time.sleep(1.0)  # its frames arrive while no command of ours runs
    assert not link.usable() and link.broken


# --- starting the runner, and the fallback ------------------------------------------------


class FakeSftp:
    """SFTP into a folder standing for the guest's root."""

    def __init__(self, root: Path, refuse: bool = False):
        self.root, self.refuse, self.uploads = root, refuse, 0

    def local(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def stat(self, path):
        return os.stat(self.local(path))

    def open(self, path, mode):
        if self.refuse:
            raise PermissionError(13, "Permission denied")
        self.uploads += 1
        self.local(path).parent.mkdir(parents=True, exist_ok=True)
        return open(self.local(path), mode)

    def posix_rename(self, old, new):
        os.replace(self.local(old), self.local(new))

    def remove(self, path):
        os.remove(self.local(path))


class LocalLauncher(SshRunnerLauncher):
    """Starts the uploaded file as a local process (or `argv`, standing for a guest without python3)."""

    def __init__(self, ssh, home: Path, argv: list[str] | None = None):
        super().__init__(ssh, start_timeout=20)
        self.home, self.argv = home, argv

    def open_transport(self):
        argv = self.argv or [sys.executable, "-I", "-S", "-u", str(self.ssh.sftp().local(RUNNER_PATH))]
        return PipeTransport(argv, runner_env(self.home), str(self.home))


def test_the_runner_is_uploaded_under_its_hash_and_sent_again_when_the_file_differs(tmp_path, home):
    assert RUNNER_SHA256[:20] in RUNNER_PATH and RUNNER_PATH.startswith("/tmp/")
    sftp = FakeSftp(tmp_path / "root")
    ssh = FakeSsh(sftp)
    launcher = LocalLauncher(ssh, home)
    launcher().close()
    assert sftp.local(RUNNER_PATH).read_bytes() == RUNNER_SOURCE and sftp.uploads == 1
    launcher().close()  # there already: not sent again
    assert sftp.uploads == 1
    sftp.local(RUNNER_PATH).write_bytes(b"#" * len(RUNNER_SOURCE))  # same size, other bytes
    launcher().close()
    assert sftp.uploads == 2 and sftp.local(RUNNER_PATH).read_bytes() == RUNNER_SOURCE
    assert not list(sftp.local("/tmp").glob("*.part"))


def test_without_python3_the_guest_falls_back_to_exec_and_says_so_once(tmp_path, home, caplog):
    sftp = FakeSftp(tmp_path / "root")
    ssh = FakeSsh(sftp)
    no_python = ["bash", "-c", "echo 'bash: line 1: python3: command not found' >&2; exit 127"]
    launcher = LocalLauncher(ssh, home, argv=no_python)
    with pytest.raises(RunnerUnavailable, match="exit status 127.*command not found"):
        launcher()
    guest = LinuxGuest(ssh, str(tmp_path), runners=RunnerPool(launcher))
    with caplog.at_level(logging.WARNING, logger="vmd.guests.linux.guest"):
        assert guest.run("echo one").exit_code == 0
        assert guest.run("echo two").exit_code == 0
    assert guest.exec_runs == 2 and guest.runner_runs == 0 and "command not found" in guest.runner_off
    assert [cmd for cmd in ssh.exec_log if "timeout -k 3" in cmd and "bash -c" in cmd] == ssh.exec_log
    warnings = [r for r in caplog.records if "runner cannot start" in r.getMessage()]
    assert len(warnings) == 1


def test_an_upload_refused_falls_back_to_exec(tmp_path, home):
    ssh = FakeSsh(FakeSftp(tmp_path / "root", refuse=True))
    guest = LinuxGuest(ssh, str(tmp_path), runners=RunnerPool(LocalLauncher(ssh, home)))
    assert guest.run("true").exit_code == 0
    assert guest.exec_runs == 1 and "refused the upload" in guest.runner_off


def test_a_passing_failure_to_start_uses_exec_for_that_command_only(tmp_path, home):
    attempts = []

    def launch():
        attempts.append(1)
        if len(attempts) == 1:
            raise RunnerUnavailable("no channel for the runner: administratively prohibited", permanent=False)
        return local_link(home)

    guest = local_guest(tmp_path, home, launch=launch)
    assert guest.run("true").exit_code == 0 and guest.exec_runs == 1
    assert guest.runner_off is None
    assert guest.run("true").exit_code == 0 and guest.runner_runs == 1
    guest.runners.close()


def test_the_exec_path_can_be_forced(tmp_path, home):
    launches = []
    guest = local_guest(tmp_path, home, launch=lambda: launches.append(1), use_runner=False)
    assert guest.run("true").exit_code == 0
    assert guest.exec_runs == 1 and not launches


# --- the bash started ahead of time ----------------------------------------------------------


def test_the_next_command_runs_in_a_bash_started_before_it_was_sent(guest):
    guest.run("true")
    time.sleep(1.0)  # the spare for the next command is started meanwhile
    # Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot.
    result = guest.run("cut -d' ' -f1 /proc/uptime; sed 's/.*) //' /proc/$$/stat | cut -d' ' -f20")
    uptime, start_ticks = result.stdout.split()
    age = float(uptime) - int(start_ticks) / os.sysconf("SC_CLK_TCK")
    assert age > 0.7, f"the command's bash started only {age:.2f} s before it ran"


def test_a_started_bash_runs_a_command_as_bash_c_would(guest, tmp_path):
    folder = tmp_path / "project" / "sub dir"
    folder.mkdir()
    for _ in range(2):  # the first may start its own bash, the second takes a spare
        result = guest.run('echo "$0|$PWD|$VMD_RUN" ; set | grep -c "^__vmd" ; exit 7', cwd=str(folder))
        name, pwd, marker = result.stdout.splitlines()[0].split("|")
        assert (name, pwd, result.exit_code) == ("bash", str(folder), 7) and marker
        assert result.stdout.splitlines()[1] == "0"  # nothing of the spare's own is left
    assert guest.run("set -e; false; echo not here").stdout == ""
    assert guest.run("if then").exit_code == 2  # a syntax error, as bash -c reports it
    assert guest.run("cat; echo end").stdout == "end\n"  # stdin is empty, not the runner's
