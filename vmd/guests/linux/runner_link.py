"""The host's end of the guest runner (vmd/guests/linux/in_guest/runner.py, whose docstring has the protocol).

A `RunnerLink` is one runner on one channel: it sends a command, reads the frames that
come back and checks each of them, since the guest is an attacker and the runner runs in
it: a frame's type must be known, its length under a cap, the end frame well-formed JSON
with this command's id; the host keeps its own deadline. Whatever goes wrong after the
command was sent ends that command (`RunnerLost`, `RunnerDeadline`) and breaks the link;
it is never sent again. A `RunnerPool` keeps idle links, one command per link at a time,
and starts another when all are busy. `SshRunnerLauncher` ships the runner over SFTP to a
path named with its hash and starts it with `python3`, checking that what runs is what
was sent. The transport of a link is anything with `send`/`recv`/`alive`/`describe`/
`close` (`ChannelTransport` over paramiko; the tests use the pipes of a local process).
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Protocol

from vmd.contract import json_depth

# Package data, never imported on the host: the guest runs it (pyproject.toml ships in_guest/).
RUNNER_SOURCE = (Path(__file__).parent / "in_guest" / "runner.py").read_bytes()
RUNNER_SHA256 = hashlib.sha256(RUNNER_SOURCE).hexdigest()
RUNNER_PATH = f"/tmp/vmd-runner-{RUNNER_SHA256[:20]}.py"
# -I: no script folder on sys.path, no PYTHON* variables; -S: no site (quicker under TCG).
RUNNER_COMMAND = f"python3 -I -S -u {RUNNER_PATH}"

HEADER = struct.Struct(">cI")
DATA_FRAMES = {b"O": "stdout", b"E": "stderr"}
MAX_DATA = 65536  # the runner reads 64 KiB at most per frame
MAX_JSON = 4096  # hello and end frames are small JSON objects
START_TIMEOUT = 60.0  # python3's start under TCG on a busy host takes seconds, not a minute

DataSink = Callable[[str, bytes], None]  # (stream, bytes)


class RunnerUnavailable(Exception):
    """The runner could not be started (nothing was sent). `permanent`: it will not work in
    this guest (no python3, upload refused, a different file runs); else a passing failure
    (a channel refused) and the next command may try again."""

    def __init__(self, reason: str, permanent: bool = True):
        super().__init__(reason)
        self.permanent = permanent


class RunnerSilent(RunnerUnavailable):
    """The runner did not say hello in time: the file at the path was not the cause (a
    missing or different file stops it or names another hash), so it is not sent again."""


class RunnerNotSent(Exception):
    """The link broke before the request was sent: the command did not run; another link may take it."""


class RunnerLost(Exception):
    """The command was sent and its result is lost: the runner died or sent something malformed."""


class RunnerDeadline(Exception):
    """The host's own deadline passed before the runner reported the end of the command."""


class _Malformed(Exception):
    pass


class _Closed(Exception):
    pass


class Transport(Protocol):
    def send(self, data: bytes) -> None: ...

    def recv(self, timeout: float) -> bytes | None:
        """Bytes (b"" at the end of the stream), or None when nothing came within `timeout`."""

    def alive(self) -> bool: ...

    def describe(self) -> str:
        """What is known of a runner that stopped (its exit status, its stderr), for errors."""

    def close(self) -> None: ...


class ChannelTransport:
    """A paramiko channel on which `python3 <runner>` was exec'd."""

    STDERR_KEEP = 2048
    STDERR_DRAIN = 1024 * 1024

    def __init__(self, channel):
        self.channel = channel
        self.stderr = bytearray()

    def send(self, data: bytes) -> None:
        self.channel.sendall(data)

    def recv(self, timeout: float) -> bytes | None:
        self._drain_stderr()
        self.channel.settimeout(max(0.0, timeout))
        try:
            return self.channel.recv(262144)
        except socket.timeout:
            return None

    def _drain_stderr(self) -> None:
        # At most STDERR_DRAIN a call: a runner (or what the guest runs in its place) that
        # writes stderr without end kept this loop, and the hello's deadline, from ever
        # coming back.
        drained = 0
        while drained < self.STDERR_DRAIN and self.channel.recv_stderr_ready():
            data = self.channel.recv_stderr(65536)
            drained += len(data) or self.STDERR_DRAIN
            self.stderr += data
            del self.stderr[:-self.STDERR_KEEP]

    def alive(self) -> bool:
        transport = self.channel.get_transport()
        return (not self.channel.closed and not self.channel.eof_received
                and not self.channel.exit_status_ready() and transport is not None and transport.is_active())

    def describe(self) -> str:
        self.channel.status_event.wait(1.0)
        try:
            self._drain_stderr()
        except Exception:
            pass
        parts = []
        if self.channel.exit_status_ready():
            parts.append(f"exit status {self.channel.recv_exit_status()}")
        text = bytes(self.stderr).decode("utf-8", "replace").strip()
        if text:
            parts.append(text[-400:])
        return "; ".join(parts) or "no exit status, nothing on stderr"

    def close(self) -> None:
        try:
            self.channel.close()
        except Exception:
            pass


class RunnerLink:
    """One runner: `hello()` once, then `run()` one command at a time."""

    def __init__(self, transport: Transport, expected_sha256: str = RUNNER_SHA256):
        self.transport = transport
        self.expected_sha256 = expected_sha256
        self.buffer = bytearray()
        self.broken = False
        self.pid: int | None = None
        self.python = ""
        self._next_id = 1

    # --- frames ------------------------------------------------------------------------

    def _read_frame(self, deadline: float) -> tuple[bytes, bytes]:
        while True:
            if len(self.buffer) >= HEADER.size:
                kind, length = HEADER.unpack_from(self.buffer)
                limit = MAX_DATA if kind in DATA_FRAMES else MAX_JSON if kind in (b"H", b"X") else None
                if limit is None:
                    raise _Malformed(f"a frame of unknown type {kind!r}")
                if length > limit:
                    raise _Malformed(f"a {kind.decode()} frame of {length} bytes (at most {limit} allowed)")
                end = HEADER.size + length
                if len(self.buffer) >= end:
                    payload = bytes(self.buffer[HEADER.size:end])
                    del self.buffer[:end]
                    return kind, payload
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            try:
                data = self.transport.recv(remaining)
            except (OSError, EOFError) as exc:
                raise _Closed(str(exc) or type(exc).__name__) from None
            if data == b"":
                raise _Closed("its channel closed")
            if data:
                self.buffer += data

    @staticmethod
    def _json(kind: bytes, payload: bytes) -> dict:
        try:
            value = json_depth.loads(payload.decode("utf-8"))
        except ValueError:  # not JSON, or nested deeper than json_depth reads
            raise _Malformed(f"a {kind.decode()} frame that is not JSON") from None
        if type(value) is not dict:
            raise _Malformed(f"a {kind.decode()} frame that is not a JSON object")
        return value

    def _break(self) -> None:
        self.broken = True
        self.transport.close()

    # --- start ---------------------------------------------------------------------------

    def hello(self, timeout: float = START_TIMEOUT) -> None:
        try:
            kind, payload = self._read_frame(time.monotonic() + timeout)
            if kind != b"H":
                raise _Malformed(f"a {kind!r} frame before its hello")
            hello = self._json(kind, payload)
        except TimeoutError:
            self._break()
            raise RunnerSilent(f"the runner did not say hello within {timeout:g} s") from None
        except _Closed:
            reason = self.transport.describe()
            self._break()
            raise RunnerUnavailable(f"the runner stopped before it said hello ({reason})") from None
        except _Malformed as exc:
            self._break()
            raise RunnerUnavailable(f"the runner's hello was malformed: {exc}") from None
        sha, pid = hello.get("sha256"), hello.get("pid")
        if sha != self.expected_sha256 or type(pid) is not int:
            self._break()
            raise RunnerUnavailable(f"the runner that started is not the one vmd sent (its hash is "
                                    f"{str(sha)[:64]!r}, vmd sent {self.expected_sha256})")
        self.pid = pid
        self.python = str(hello.get("python", ""))[:20]

    def usable(self) -> bool:
        """Idle and healthy: alive, and nothing arrived since its last command ended."""
        if self.broken or self.buffer or not self.transport.alive():
            return False
        try:
            stray = self.transport.recv(0)
        except (OSError, EOFError):
            stray = b""
        if stray is None:
            return True
        self._break()  # it spoke out of turn, or it closed
        return False

    # --- one command -----------------------------------------------------------------------

    def run(self, command: str, cwd: str, timeout: float, marker: str, sink: DataSink,
            deadline: float) -> tuple[int, bool]:
        """Runs `command` and feeds its output to `sink`; returns (exit code, timed out)."""
        if self.broken:
            raise RunnerNotSent("the runner is broken")
        request_id = self._next_id
        self._next_id += 1
        request = json.dumps({"id": request_id, "command": command, "cwd": cwd, "timeout": timeout,
                              "marker": marker}) + "\n"
        try:
            # A failed send never delivered the newline, so the runner did not start it.
            self.transport.send(request.encode())
        except Exception as exc:
            self._break()
            raise RunnerNotSent(str(exc) or type(exc).__name__) from None
        try:
            while True:
                kind, payload = self._read_frame(deadline)
                stream = DATA_FRAMES.get(kind)
                if stream is not None:
                    sink(stream, payload)
                    continue
                if kind != b"X":
                    raise _Malformed(f"a {kind.decode()} frame while a command ran")
                end = self._json(kind, payload)
                code, timed_out = end.get("exit_code"), end.get("timed_out")
                if (end.get("id") != request_id or type(end.get("id")) is not int
                        or type(code) is not int or not 0 <= code <= 255 or type(timed_out) is not bool):
                    raise _Malformed(f"an end frame that does not fit: {payload[:200]!r}")
                return code, timed_out
        except TimeoutError:
            self._break()
            raise RunnerDeadline() from None
        except _Closed as exc:
            reason = self.transport.describe()
            self._break()
            raise RunnerLost(f"the runner in the guest stopped while the command ran ({exc}; {reason})") from None
        except _Malformed as exc:
            self._break()
            raise RunnerLost(f"the runner in the guest sent {exc}") from None
        except BaseException:
            self._break()  # the sink raised, or KeyboardInterrupt: the link is out of step
            raise

    def close(self) -> None:
        self._break()


class RunnerPool:
    """Idle runner links of one guest; `acquire` gives one (starting a runner when all are
    busy), `release` takes it back. Thread-safe."""

    def __init__(self, launch: Callable[[], RunnerLink], max_idle: int = 2):
        self.launch = launch
        self.max_idle = max_idle
        self.idle: list[RunnerLink] = []
        self.started = 0  # runners started, for tests and the benchmark
        self._lock = threading.Lock()

    def acquire(self) -> RunnerLink:
        while True:
            with self._lock:
                link = self.idle.pop() if self.idle else None
            if link is None:
                break
            if link.usable():
                return link
            link.close()
        link = self.launch()
        with self._lock:
            self.started += 1
        return link

    def release(self, link: RunnerLink) -> None:
        if not link.broken:
            with self._lock:
                if len(self.idle) < self.max_idle:
                    self.idle.append(link)
                    return
        link.close()

    def idle_count(self) -> int:
        with self._lock:
            return len(self.idle)

    def close(self) -> None:
        with self._lock:
            idle, self.idle = self.idle, []
        for link in idle:
            link.close()


class SshRunnerLauncher:
    """Starts a runner on a new channel of `ssh` (vmd.guests.ssh.SshConnection), uploading the
    runner first when the guest lacks it, and once more when what starts is not it."""

    def __init__(self, ssh, start_timeout: float = START_TIMEOUT, command: str = RUNNER_COMMAND):
        self.ssh = ssh
        self.start_timeout = start_timeout
        self.command = command  # how it is started (`sudo -n` before it: a runner as root)
        self._upload_lock = threading.Lock()

    def __call__(self) -> RunnerLink:
        uploaded = self._upload(force=False)
        try:
            return self._launch()
        except RunnerUnavailable as exc:
            # A silent runner is not sent again: a guest that never says hello (to force the
            # exec path) would otherwise cost the first command two start bounds.
            if uploaded or not exc.permanent or isinstance(exc, RunnerSilent):
                raise
        self._upload(force=True)  # a missing or different file at the path: send it again
        return self._launch()

    def _upload(self, force: bool) -> bool:
        """Sends the runner unless the guest has a file of its size at the path (the hello
        checks its hash); True when it sent it."""
        with self._upload_lock:
            try:
                sftp = self.ssh.sftp()
            except Exception as exc:
                raise RunnerUnavailable(f"no SFTP to upload the runner: {exc}", permanent=False) from None
            part = f"{RUNNER_PATH}.{uuid.uuid4().hex[:8]}.part"
            try:
                if not force:
                    try:
                        if sftp.stat(RUNNER_PATH).st_size == len(RUNNER_SOURCE):
                            return False
                    except TimeoutError:
                        raise
                    except OSError:  # not there, or not readable: send it
                        pass
                with sftp.open(part, "wb") as fh:
                    fh.write(RUNNER_SOURCE)
                sftp.posix_rename(part, RUNNER_PATH)  # atomic: a runner starting now reads one or the other
            except TimeoutError:  # the guest stopped answering: no fault of the runner, try again later
                self.ssh.drop_sftp()
                raise RunnerUnavailable("the guest did not answer the runner's upload", permanent=False) from None
            except Exception as exc:
                try:
                    sftp.remove(part)
                except Exception:
                    pass
                raise RunnerUnavailable(f"the guest refused the upload of the runner to {RUNNER_PATH} "
                                        f"({exc or type(exc).__name__})") from None
            return True

    def _launch(self) -> RunnerLink:
        link = RunnerLink(self.open_transport())
        link.hello(self.start_timeout)
        return link

    def open_transport(self) -> Transport:
        """A new channel running the runner (the tests run it as a local process)."""
        try:
            channel = self.ssh.open_channel(command=self.command)
        except Exception as exc:
            raise RunnerUnavailable(f"no channel for the runner: {exc or type(exc).__name__}",
                                    permanent=False) from None
        return ChannelTransport(channel)
