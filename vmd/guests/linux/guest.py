"""A Linux guest over SSH (vmd/guests/guest.py `Guest`): commands through the runner kept
in the guest, or one exec channel each where no runner can start; files over SFTP; every
request bounded in time and size. Its OS verbs are `LinuxVerbs` (vmd/guests/linux/verbs.py)."""

from __future__ import annotations

import logging
import posixpath
import shlex
import stat
import threading
import time
import uuid

import paramiko

from vmd.contract.bounds import READ_LIMIT  # the contract's bound on one read
from vmd.contract.shown_text import one_line
from vmd.guests.guest import (CommandResult, DirListing, FileChunk, Guest, GuestError, GuestFacts,
                              OutputCallback, listing_of)
from vmd.guests.linux.runner_link import (RUNNER_COMMAND, RunnerDeadline, RunnerLost, RunnerNotSent, RunnerPool, RunnerUnavailable,
                                          SshRunnerLauncher)
from vmd.guests.linux.verbs import LinuxVerbs
from vmd.guests.output import DEFAULT_BOUNDS, _CappedStream, _LineSplitter
from vmd.guests.ssh import LIST_TIME_S, NAME_MAX_BYTES, SshConnection, drain

log = logging.getLogger("vmd.guests.linux.guest")

# Characters of the guest's own words (an SFTP server's status text) in an error message.
GUEST_TEXT_CHARS = 500


class LinuxGuest(LinuxVerbs, Guest):
    """A Linux guest over SSH. Commands go through a runner kept in the guest
    (vmd/guests/linux/in_guest/runner.py, vmd/guests/linux/runner_link.py): one `bash -c` per command. Where the runner
    cannot start (no python3, an upload refused), each command is its own SSH exec of
    `timeout … bash -c`, the path it replaced; `use_runner = False` forces that path."""

    os_family = "linux"
    use_runner = True
    output = DEFAULT_BOUNDS  # what `run` keeps of each stream; the machine sets vmd's config's

    def __init__(self, ssh: SshConnection, project_path: str = "/mnt/project", *,
                 use_runner: bool | None = None, runners: RunnerPool | None = None):
        self.ssh = ssh
        self.project_path = project_path
        if use_runner is not None:
            self.use_runner = use_runner
        self.runners = runners if runners is not None else RunnerPool(SshRunnerLauncher(ssh))
        self.runner_off: str | None = None  # why this guest's commands go through exec instead
        self.runner_runs = 0  # commands the runner ran (tests, the benchmark)
        self.exec_runs = 0  # commands exec'd one channel each
        self._prewarming: threading.Thread | None = None  # the runner `restored` starts
        self._root_link = None  # a runner as root, kept for `resumed` (keep_root_runner)
        self._count_lock = threading.Lock()  # the counters and runner_off

    @property
    def user(self) -> str:
        return self.ssh.user

    def forget_identity(self) -> None:
        self.runners.close()  # the runners' processes sit in the share, which must unmount
        self.use_runner = False
        super().forget_identity()

    def restored(self, now: float, mount_share: bool) -> GuestFacts:
        """A guest restored from a save (vmd/machines/warm_pool.py) in one command: its clock,
        which stood still from the save to the restore, set; the share mounted; its facts.
        Through one exec channel, while the command runner starts in the background (a
        runner's start costs a second under TCG, more than this whole command)."""
        prefix = f"sudo -n date -u -s @{now:.3f} >/dev/null 2>&1; "
        if mount_share:
            prefix += f"{self._mount_line()} >/dev/null 2>&1; "
        once = LinuxGuest(self.ssh, self.project_path, use_runner=False)
        facts = self.facts(prefix, runner=once.run)
        self._prewarming = threading.Thread(target=self.prewarm, name="prewarm", daemon=True)
        self._prewarming.start()
        return facts

    def prewarmed(self, timeout: float) -> bool:
        """Waits (at most `timeout` s) for the runner `restored` started; whether one is idle
        now, ready for the next command (a parked slot is paused only once it is:
        vmd/machines/parked_slot.py)."""
        if self._prewarming is not None:
            self._prewarming.join(timeout)
        return self.runners.idle_count() > 0

    def keep_root_runner(self) -> bool:
        """Starts a runner as root beside the agent's, kept for `resumed` (a parked slot,
        vmd/machines/parked_slot.py): setting the clock through it costs one `date`, where
        `sudo` costs ~0.25 s more under TCG (measured: sudo -n true 222 ms, date 120 ms,
        bash's `true` 57 ms through a runner). Whether one is up."""
        try:
            self._root_link = SshRunnerLauncher(self.ssh, command=f"sudo -n {RUNNER_COMMAND}")()
        except RunnerUnavailable as exc:
            log.info("no runner as root in the guest at %s:%s (%s); a parked guest's clock is set through sudo",
                     self.ssh.host, self.ssh.port, exc)
            return False
        return True

    def resumed(self, now: float) -> bool:
        """A guest paused since it was woken (a parked slot, vmd/machines/parked_slot.py) at
        work again: its clock, which stood still while it was paused, set, through the root
        runner it kept (then closed), else through sudo and the agent's runner. Whether the
        project share is mounted, read by bash itself (`mountpoint` is one more program to
        start, ~70 ms under TCG)."""
        clock = f"date -u -s @{now:.3f} >/dev/null 2>&1 && echo clock; "
        mounted = ("while read -r _ _ _ _ point _; do [ \"$point\" = " + shlex.quote(self.project_path)
                   + " ] && { echo mounted; break; }; done </proc/self/mountinfo; true")
        link, self._root_link = self._root_link, None
        if link is not None:
            said = bytearray()

            def sink(stream: str, data: bytes) -> None:
                if stream == "stdout":
                    said.extend(data[:1024 - len(said)])

            try:
                link.run(clock + mounted, "/", 30, uuid.uuid4().hex, sink, time.monotonic() + 40)
                lines = bytes(said).decode(errors="replace").split()
                if "clock" in lines:
                    return "mounted" in lines
                log.info("the root runner of a parked guest did not set its clock; sudo does")
            except (RunnerNotSent, RunnerLost, RunnerDeadline) as exc:
                log.info("the root runner of a parked guest failed (%s); its clock is set through sudo", exc)
            finally:
                link.close()
        done = self.run(f"sudo -n {clock}{mounted}", timeout=30, cwd="/")
        return "mounted" in done.stdout.split()

    # --- shell ---------------------------------------------------------------------

    def run(self, command: str, timeout: float = 300, cwd: str | None = None,
            on_output: OutputCallback | None = None) -> CommandResult:
        marker = uuid.uuid4().hex
        cwd = self.resolve(cwd) if cwd else self.project_path
        seconds = max(1, int(round(timeout)))
        started = time.monotonic()
        deadline = started + timeout + 10  # the guest's own timeout fires first
        caps = {"stdout": _CappedStream(self.output.head, self.output.tail),
                "stderr": _CappedStream(self.output.head, self.output.tail)}
        splitters = {"stdout": _LineSplitter("stdout", on_output), "stderr": _LineSplitter("stderr", on_output)}

        def sink(stream: str, data: bytes) -> None:
            caps[stream].add(data)
            splitters[stream].feed(data)

        killed = False  # everything marked is killed already (by the runner)
        try:
            outcome = self._run_in_runner(command, cwd, seconds, marker, sink, deadline)
            if outcome is not None:
                exit_code, timed_out = outcome
                killed = timed_out
            else:
                exit_code, timed_out = self._run_exec(command, cwd, seconds, marker, sink, deadline)
                if exit_code == 124 and time.monotonic() - started >= timeout - 0.5:
                    timed_out = True
        except RunnerDeadline:
            exit_code, timed_out = 124, True
        except RunnerLost as exc:
            self._kill_marked(marker)
            raise GuestError(
                f"{exc}. The command's result is lost and vmd did not run it again; look at what it "
                "changed before you run it again.") from None
        finally:
            for splitter in splitters.values():
                splitter.flush()
        if timed_out and not killed:
            self._kill_marked(marker)
        duration = time.monotonic() - started
        out, err = caps["stdout"], caps["stderr"]
        stderr = err.text()
        if timed_out:
            stderr += (f"\n[vmd: the command ran past its {timeout:g} s timeout and was killed with "
                       "everything it started; give a longer timeout or run it in smaller steps]")
        return CommandResult(exit_code=exit_code, stdout=out.text(), stderr=stderr,
                             duration=round(duration, 3), truncated=bool(out.dropped or err.dropped),
                             timed_out=timed_out)

    def prewarm(self) -> None:
        """Starts a runner ahead of the first command, so that it does not wait for one."""
        if not self.use_runner or self.runner_off is not None:
            return
        try:
            link = self.runners.acquire()
        except Exception:  # the first command tries again and says why
            return
        self.runners.release(link)

    def _run_in_runner(self, command: str, cwd: str, seconds: int, marker: str, sink,
                       deadline: float) -> tuple[int, bool] | None:
        """(exit code, timed out) from a runner, or None when no runner could take the
        command (it was not sent): then the exec path runs it."""
        if not self.use_runner or self.runner_off is not None:
            return None
        for _ in range(3):
            try:
                link = self.runners.acquire()
            except RunnerUnavailable as exc:
                # A dropped connection is no fault of the runner: the next command tries again.
                if exc.permanent and self.ssh.active():
                    with self._count_lock:
                        first, self.runner_off = self.runner_off is None, self.runner_off or str(exc)
                    if first:
                        log.warning("the command runner cannot start in the guest at %s:%s (%s); every "
                                    "command there now goes through its own SSH exec, which is slower",
                                    self.ssh.host, self.ssh.port, exc)
                return None
            try:
                outcome = link.run(command, cwd, seconds, marker, sink, deadline)
            except RunnerNotSent:
                continue  # it never reached the runner: another one may take it
            finally:
                self.runners.release(link)
            with self._count_lock:
                self.runner_runs += 1
            return outcome
        return None

    def _run_exec(self, command: str, cwd: str, seconds: int, marker: str, sink,
                  deadline: float) -> tuple[int, bool]:
        """The fallback: one SSH exec of `timeout … bash -c` per command."""
        # `timeout` signals the command's whole process group (not when exec'd as the SSH
        # session leader: measured, the group kill then never came), and the marker in the
        # environment finds anything that escaped the group (setsid, daemons) so that
        # nothing outlives its time.
        wrapped = (
            f"cd {shlex.quote(cwd)} 2>/dev/null || cd ~; "
            f"export VMD_RUN={marker}; "
            f"timeout -k 3 {seconds} bash -c {shlex.quote(command)} </dev/null"
        )
        channel = self.ssh.open_channel(command=wrapped)
        with self._count_lock:
            self.exec_runs += 1
        return drain(channel, sink, deadline)

    def _kill_marked(self, marker: str) -> None:
        # One grep over every process environment: a loop forking a grep per process
        # took over 10 s under TCG.
        script = (f"pids=$(grep -lsa 'VMD_RUN={marker}' /proc/[0-9]*/environ | cut -d/ -f3); "
                  "[ -z \"$pids\" ] || kill -9 $pids 2>/dev/null; true")
        try:
            channel = self.ssh.open_channel(
                command=f"sudo -n sh -c {shlex.quote(script)} || sh -c {shlex.quote(script)}", timeout=10)
            channel.status_event.wait(30)  # bounded: a guest going away must not hang the caller
            channel.close()
        except Exception:
            pass

    # --- files ---------------------------------------------------------------------

    def resolve(self, path: str) -> str:
        if not path:
            return self.project_path
        if "\\" in path or (len(path) > 1 and path[1] == ":"):
            raise GuestError(f"'{path}' is a Windows path; this guest is Linux: use paths like "
                             f"{self.project_path}/file.txt")
        if not path.startswith("/"):
            path = posixpath.join(self.project_path, path)
        return posixpath.normpath(path)

    def _sftp_call(self, verb: str, path: str, fn):
        try:
            return fn()
        except FileNotFoundError:
            raise GuestError(f"{verb} {path}: no such file or directory in the guest; "
                             f"list_dir its parent to see what is there") from None
        except PermissionError:
            raise GuestError(f"{verb} {path}: permission denied for the user '{self.ssh.user}'; "
                             f"work under {self.project_path} or use run with sudo") from None
        except IsADirectoryError:
            raise GuestError(f"{verb} {path}: that is a directory; use list_dir") from None
        except TimeoutError:  # one SFTP reply did not come: the client is out of step now
            self.ssh.drop_sftp()
            raise GuestError(f"{verb} {path}: the guest did not answer within {self.ssh.sftp_reply_timeout:g} s "
                             "(it is paused, overloaded or gone); try again, or run a command to see "
                             "whether it still answers") from None
        except EOFError:  # paramiko's word for a connection closed under the call (vmd's close)
            raise GuestError(f"{verb} {path}: the connection to the guest closed during the call; "
                             "run a command to see whether the guest still answers") from None
        except (OSError, paramiko.SSHException) as exc:  # its text may be the guest's: one line, cut
            raise GuestError(f"{verb} {path}: {one_line(str(exc))[:GUEST_TEXT_CHARS]}") from None

    def read_file(self, path: str, offset: int = 0, limit: int | None = None) -> FileChunk:
        full = self.resolve(path)
        limit = min(limit or READ_LIMIT, READ_LIMIT)  # one read holds this much in vmd at most

        def read():
            sftp = self.ssh.sftp()
            attrs = sftp.stat(full)
            if stat.S_ISDIR(attrs.st_mode or 0):
                raise IsADirectoryError(full)
            with sftp.open(full, "rb") as fh:
                fh.seek(offset)
                data = fh.read(limit + 1)
            return attrs.st_size or 0, data

        size, data = self._sftp_call("read_file", full, read)
        truncated = len(data) > limit
        return FileChunk(content=data[:limit].decode("utf-8", "replace"), size=size,
                         offset=offset, truncated=truncated)

    def _write(self, verb: str, path: str, content: str | bytes, mode: str) -> int:
        full = self.resolve(path)
        data = content.encode() if isinstance(content, str) else content

        def write():
            sftp = self.ssh.sftp()
            self._make_parents(sftp, posixpath.dirname(full))
            with sftp.open(full, mode) as fh:
                fh.write(data)
            return len(data)

        return self._sftp_call(verb, full, write)

    def _make_parents(self, sftp: paramiko.SFTPClient, folder: str) -> None:
        missing = []
        while folder not in ("", "/"):
            try:
                sftp.stat(folder)
                break
            except FileNotFoundError:
                missing.append(folder)
                folder = posixpath.dirname(folder)
        for part in reversed(missing):
            sftp.mkdir(part)

    def write_file(self, path: str, content: str | bytes) -> int:
        return self._write("write_file", path, content, "wb")

    def append_file(self, path: str, content: str | bytes) -> int:
        return self._write("append_file", path, content, "ab")

    def list_dir(self, path: str) -> DirListing:
        full = self.resolve(path)

        def listing():
            sftp = self.ssh.sftp()
            folder = sftp.list_folder(full)
            if folder.out_of_step:  # a reply was cut off by the time bound
                self.ssh.drop_sftp()
            return listing_of(folder, list_time_s=LIST_TIME_S, fold_case=False, narrower="run('ls | head')",
                              long_names=f"{NAME_MAX_BYTES} bytes (longer than any Linux file name)")

        return self._sftp_call("list_dir", full, listing)

    def close(self) -> None:
        link, self._root_link = self._root_link, None
        if link is not None:
            link.close()
        self.runners.close()
        self.ssh.close()
