"""vmd's command runner inside the guest (stdlib only, Python >= 3.9; this file is shipped
into the guest by vmd, vmd/guests/linux/runner_link.py is its host end).

vmd starts it once per SSH channel as `python3 -I -S -u <this file>` and keeps it: a
command then costs one `bash -c` in the guest instead of a new channel, a login shell,
`timeout` and bash (the exec path of vmd/guests/linux/guest.py, still there as the fallback).

Requests, host -> runner, one JSON object a line:
    {"id": int, "command": str, "cwd": str, "timeout": number, "marker": str}
Replies, runner -> host, frames: one type byte, a 4-byte big-endian length, the payload:
    H  hello, once at start: JSON {"sha256": of this file as read from disk, "pid", "python"}
    O  stdout bytes of the running command (at most 65536 a frame)
    E  stderr bytes
    X  the end of a command: JSON {"id", "exit_code", "timed_out"}
One command at a time. The host trusts none of it: it checks every frame (vmd/guests/linux/runner_link.py).

A command runs as `bash -c <command>` in a new session (its own process group), stdin
/dev/null, in `cwd` (or the home folder when `cwd` cannot be entered, as `cd cwd || cd ~`),
with VMD_RUN=<marker> added to the environment. Past its timeout the group gets SIGTERM,
SIGKILL 3 s later (as `timeout -k 3` did), and every process whose environment carries the
marker (setsid daemons) is killed; the exit code is then 124. A command killed by a signal
exits 128+signal, as bash reports it. When the host goes (stdin closes), the running
command is killed the same way and the runner exits.
"""

import hashlib
import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import time

HEADER = struct.Struct(">cI")
MAX_DATA = 65536
KILL_AFTER = 3.0  # seconds between SIGTERM and SIGKILL, as `timeout -k 3`
DRAIN = 0.2  # at most this long to read what a command left in its pipes after it ended
QUIET_SIGNALS = (signal.SIGINT, signal.SIGPIPE)  # bash does not report these deaths either


class HostGone(Exception):
    """stdin closed or stdout broken: nobody reads the results any more."""


def write_frame(kind, payload=b""):
    data = HEADER.pack(kind, len(payload)) + payload
    view = memoryview(data)
    while view:
        try:
            n = os.write(1, view)
        except InterruptedError:
            continue
        except OSError:
            raise HostGone()
        view = view[n:]


class Requests:
    """Lines from stdin, readable with select while a command runs."""

    def __init__(self):
        self.buffer = b""
        self.closed = False

    def fill(self):
        """Reads what is there (stdin is ready); False at end of file."""
        try:
            data = os.read(0, 65536)
        except InterruptedError:
            return True
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return False
        self.buffer += data
        return True

    def next_line(self):
        """The next request line, blocking; None once stdin closed."""
        while b"\n" not in self.buffer:
            if self.closed or not self.fill():
                return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


def kill_marked(marker):
    """SIGKILL every process whose environment carries VMD_RUN=<marker>: one scan of
    /proc/*/environ, repeated while it finds some (what a dying daemon forked in the
    meantime). Returns True when some environment could not be read (another user's)."""
    needle = b"VMD_RUN=" + marker.encode()
    me = os.getpid()
    unreadable = False
    for _ in range(5):
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                with open("/proc/%s/environ" % name, "rb") as fh:
                    data = fh.read()
            except OSError:
                unreadable = True
                continue
            if needle in data:
                found.append(int(name))
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not found:
            break
    return unreadable


def kill_marked_as_root(marker):
    """The same kill through `sudo -n`, for marked processes of other users (root's)."""
    script = ("pids=$(grep -lsa 'VMD_RUN=%s' /proc/[0-9]*/environ | cut -d/ -f3); "
              "[ -z \"$pids\" ] || kill -9 $pids 2>/dev/null; true" % marker)
    try:
        subprocess.run(["sudo", "-n", "sh", "-c", script], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20)
    except (OSError, subprocess.SubprocessError):
        pass


def kill_everything(proc, marker):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    if kill_marked(marker) and os.geteuid() != 0:
        kill_marked_as_root(marker)


def working_dir(cwd):
    if cwd and os.path.isdir(cwd) and os.access(cwd, os.X_OK):
        return cwd
    home = os.environ.get("HOME", "")
    if home and os.path.isdir(home) and os.access(home, os.X_OK):
        return home
    return START_DIR


# A bash started ahead of time that waits for its command on fd 3: starting bash costs
# 65-97 ms in a guest under TCG (measured), most of a short command's time, so the next
# command's bash is started while the runner waits. It reads the folder, the marker and
# the command (NUL-separated), closes fd 3, enters the folder as `cd dir || cd ~` did,
# exports the marker for everything the command starts, and evals the command: the same
# shell, options and exit codes as `bash -c <command>`. Without input it exits unused.
SPARE_SCRIPT = (
    'read -r -d "" -u {fd} __vmd_cwd && read -r -d "" -u {fd} __vmd_marker '
    '&& read -r -d "" -u {fd} __vmd_command || exit 0; exec {fd}<&-; '
    'cd -- "$__vmd_cwd" 2>/dev/null || cd ~; export VMD_RUN="$__vmd_marker"; '
    'unset __vmd_cwd __vmd_marker; eval "unset __vmd_command; $__vmd_command"'
)


class Spares:
    """One bash kept started for the next command (see SPARE_SCRIPT)."""

    def __init__(self):
        self.spare = None  # (proc, write end of its fd 3)

    def start(self):
        if self.spare is not None:
            return
        read_end, write_end = os.pipe()
        try:
            env = dict(START_ENV)
            env[b"OLDPWD"] = os.fsencode(START_DIR)
            # pass_fds keeps the read end open in bash under its own number, which the
            # script names; no preexec_fn, so Python can still spawn without a full fork.
            proc = subprocess.Popen(
                [b"bash", b"-c", SPARE_SCRIPT.format(fd=read_end).encode()],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=START_DIR, env=env, start_new_session=True, pass_fds=(read_end,))
        except (OSError, ValueError):
            os.close(write_end)
            return
        finally:
            os.close(read_end)
        self.spare = (proc, write_end)

    def take(self, command, cwd, marker, env):
        """A process running `command`: the spare when there is one, else a new bash."""
        data = command.encode("utf-8", "surrogateescape")
        if b"\0" in data or b"\0" in os.fsencode(cwd) or "\0" in marker:
            raise ValueError("the command holds a NUL byte")
        spare, self.spare = self.spare, None
        if spare is not None:
            proc, write_end = spare
            try:
                os.write(write_end, b"\0".join((os.fsencode(cwd), marker.encode(), data)) + b"\0")
                return proc
            except OSError:  # it died while waiting: start the command the slow way
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
            finally:
                os.close(write_end)
        return subprocess.Popen(
            [b"bash", b"-c", data], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True)

    def close(self):
        spare, self.spare = self.spare, None
        if spare is not None:
            proc, write_end = spare
            os.close(write_end)  # it reads end of file and exits unused
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


SPARES = Spares()


def run(request, requests):
    command = request["command"]
    marker = str(request["marker"])
    timeout = max(1.0, float(request["timeout"]))
    cwd = working_dir(request.get("cwd") or "")
    env = dict(START_ENV)
    env[b"VMD_RUN"] = marker.encode()
    env[b"PWD"] = os.fsencode(cwd)
    env[b"OLDPWD"] = os.fsencode(START_DIR)
    try:
        proc = SPARES.take(command, cwd, marker, env)
    except (OSError, ValueError) as exc:  # no bash, or a NUL byte in the command
        write_frame(b"E", ("vmd runner: could not start bash: %s\n" % exc).encode()[:MAX_DATA])
        return 127, False
    selector = selectors.DefaultSelector()
    streams = {}
    pidfd = None
    deadline = time.monotonic() + timeout
    kill_at = None
    timed_out = False
    ended_at = None
    try:
        for pipe, kind in ((proc.stdout, b"O"), (proc.stderr, b"E")):
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ, kind)
            streams[fd] = pipe
        selector.register(0, selectors.EVENT_READ, b"I")
        if hasattr(os, "pidfd_open"):  # Linux 5.3; else poll() every 50 ms
            try:
                pidfd = os.pidfd_open(proc.pid)
                selector.register(pidfd, selectors.EVENT_READ, b"P")
            except OSError:
                pidfd = None
        while True:
            now = time.monotonic()
            if proc.returncode is None and proc.poll() is not None:
                ended_at = now
                if timed_out:
                    kill_everything(proc, marker)
                    now = time.monotonic()
                    ended_at = now
            if ended_at is None:
                if not timed_out and now >= deadline:
                    timed_out = True
                    kill_at = now + KILL_AFTER
                    try:
                        os.killpg(proc.pid, signal.SIGTERM)
                    except OSError:
                        pass
                elif timed_out and kill_at is not None and now >= kill_at:
                    kill_at = None
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
            if ended_at is not None and (not streams or now >= ended_at + DRAIN):
                break
            if ended_at is not None:
                wait = min(0.02, ended_at + DRAIN - now)
            elif not timed_out:
                wait = deadline - now
            elif kill_at is not None:
                wait = kill_at - now
            else:
                wait = 0.1
            if pidfd is None and ended_at is None:
                wait = min(wait, 0.05)
            events = selector.select(max(0.0, wait))
            if ended_at is not None and not events:
                break  # what the command wrote is read; a leftover writer is not waited for
            for key, _ in events:
                kind = key.data
                if kind == b"P":
                    selector.unregister(pidfd)
                    continue  # poll() above reaps it
                if kind == b"I":
                    if not requests.fill():
                        raise HostGone()
                    continue
                try:
                    data = os.read(key.fd, MAX_DATA)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    write_frame(kind, data)
                else:
                    selector.unregister(key.fd)
                    streams.pop(key.fd).close()
    except BaseException:  # the host went, or a fault here: the command is not left unwatched
        kill_everything(proc, marker)
        raise
    finally:
        selector.close()
        for pipe in streams.values():
            pipe.close()
        if pidfd is not None:
            os.close(pidfd)
    if timed_out:
        return 124, True
    code = proc.returncode
    if code < 0:
        if -code not in QUIET_SIGNALS:
            name = signal.strsignal(-code) if hasattr(signal, "strsignal") else None
            write_frame(b"E", ("%s\n" % (name or "Killed by signal %d" % -code)).encode())
        code = 128 - code
    return code, False


def own_hash():
    with open(os.path.abspath(__file__), "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def main():
    write_frame(b"H", json.dumps({"sha256": own_hash(), "pid": os.getpid(),
                                  "python": sys.version.split()[0]}).encode())
    SPARES.start()
    requests = Requests()
    while True:
        line = requests.next_line()
        if line is None:
            return
        if not line.strip():
            continue
        request = json.loads(line.decode("utf-8"))
        try:
            code, timed_out = run(request, requests)
        except HostGone:
            raise
        except Exception as exc:  # e.g. a command that cannot be encoded; it did not run
            message = "vmd runner: %s: %s\n" % (type(exc).__name__, exc)
            write_frame(b"E", message.encode("utf-8", "replace")[:MAX_DATA])
            code, timed_out = 127, False
        write_frame(b"X", json.dumps({"id": request["id"], "exit_code": code,
                                      "timed_out": timed_out}).encode())
        SPARES.start()  # while the host reads the result and sends the next command


def start_env():
    """The environment this process was started with, as a command gets it from a login
    shell: Python may have added LC_CTYPE to os.environ (PEP 538's locale coercion)."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            pairs = [item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item]
        env = dict(pairs)
    except OSError:
        env = dict(os.environb)
    try:  # bash exec'd python3 as the last command of its -c and counted itself out
        env[b"SHLVL"] = str(int(env.get(b"SHLVL", b"0")) + 1).encode()
    except ValueError:
        pass
    return env


try:
    START_DIR = os.getcwd()
except OSError:
    START_DIR = "/"
START_ENV = start_env()

if __name__ == "__main__":
    try:
        main()
    except HostGone:
        pass
    finally:
        SPARES.close()
