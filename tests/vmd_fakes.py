"""A stand-in machine for vmd tests that need no guest: commands run with bash on this
host, in the session's project folder, which is what the real guest mounts. The fake
gives no ground to the rules under test: vmd still runs the verification itself."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from vmd.machine_port import MachineSpec


class LocalMachine:
    os_family = "linux"

    def __init__(self, spec: MachineSpec, factory: "LocalMachines"):
        self.spec = spec
        self.factory = factory
        root = spec.project_dir or Path(tempfile.mkdtemp(prefix="vmd-fake-home-"))
        self.project_path = str(root)
        self.suspended = False
        self.destroyed = False
        # Set by a test to play a guest destroyed from outside (or crashed): alive() says
        # so and every machine call fails the way a dropped SSH connection does.
        self.gone = False

    def alive(self) -> bool:
        return not self.gone

    def _reachable(self) -> None:
        if self.gone:
            raise ConnectionResetError("the SSH connection to the guest was reset")
        if self.suspended:  # a paused guest does not answer; SSH would time out
            raise TimeoutError("the guest did not answer: it is paused")

    def _path(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.project_path) / p

    def ready(self, timeout, desktop=False):
        time.sleep(self.factory.boot_seconds)
        self._reachable()
        return {"os": "fake linux", "kernel": os.uname().release, "python": "", "git": "",
                "desktop": desktop, "project_path": self.project_path, "boot_id": "fake",
                "hostname": "fake"}

    def run(self, command, timeout, cwd, on_output):
        self._reachable()
        started = time.monotonic()
        proc = subprocess.run(["bash", "-c", command], cwd=self._path(cwd) if cwd else self.project_path,
                              capture_output=True, text=True, timeout=timeout)
        if on_output:
            for line in proc.stdout.splitlines():
                on_output("stdout", line)
            for line in proc.stderr.splitlines():
                on_output("stderr", line)
        return {"exit_code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
                "duration": round(time.monotonic() - started, 3), "truncated": False, "timed_out": False}

    def read_file(self, path, offset, limit):
        self._reachable()
        data = self._path(path).read_bytes()
        chunk = data[offset: offset + limit if limit else None]
        return {"content": chunk.decode(), "size": len(data), "offset": offset,
                "truncated": offset + len(chunk) < len(data)}

    def run_baseline(self, command, archive, timeout):
        """The check in a copy of the baseline (the fake has no mount namespace to show it
        at the project's own path; the real guest does, see vmd/verification.py)."""
        import io
        import tarfile
        self._reachable()
        folder = Path(tempfile.mkdtemp(prefix="vmd-fake-baseline-"))
        try:
            tarfile.open(fileobj=io.BytesIO(archive)).extractall(folder, filter="data")
            started = time.monotonic()
            proc = subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, text=True,
                                  timeout=timeout)
            return {"exit_code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
                    "duration": round(time.monotonic() - started, 3), "truncated": False, "timed_out": False}
        finally:
            import shutil
            shutil.rmtree(folder, ignore_errors=True)

    def write_file(self, path, content):
        self._reachable()
        p = self._path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        return len(content.encode())

    def append_file(self, path, content):
        self._reachable()
        with open(self._path(path), "a") as fh:
            fh.write(content)
        return len(content.encode())

    def edit_file(self, path, old, new):
        self._reachable()
        p = self._path(path)
        text = p.read_text()
        n = text.count(old)
        if n != 1:
            raise ValueError(f"edit_file {path}: `old` matched {n} times; it must match exactly once.")
        p.write_text(text.replace(old, new))

    def list_dir(self, path):
        self._reachable()
        return [{"name": e.name, "type": "dir" if e.is_dir() else "file", "size": e.stat().st_size}
                for e in sorted(self._path(path).iterdir())]

    def screenshot(self):
        self._reachable()
        png = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00"
               b"\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\xff\xff?\x00\x05\xfe\x02\xfe\xa75\x81\x84"
               b"\x00\x00\x00\x00IEND\xaeB`\x82")
        return {"png": png, "width": 1, "height": 1, "scale": 1.0}

    def click(self, x, y, button, double):
        self.factory.input.append(("click", x, y, button, double))

    def move(self, x, y):
        self.factory.input.append(("move", x, y))

    def scroll(self, x, y, amount):
        self.factory.input.append(("scroll", x, y, amount))

    def type(self, text):
        self.factory.input.append(("type", text))

    def key(self, keys):
        if keys == "nonsense":
            raise ValueError("unknown key name 'nonsense'; use names like ctrl, alt, Return, F4.")
        self.factory.input.append(("key", keys))

    def launch_app(self, path, args):
        return f"started {path}."

    def check_internet(self):
        return False, "egress closed"

    def reboot(self, timeout):
        return 0.1

    def suspend(self):
        self.suspended = True

    def resume(self):
        self.suspended = False

    def destroy(self):
        self.destroyed = True
        self.factory.destroyed.append(self.spec.name)


class LocalMachines:
    def __init__(self, boot_seconds: float = 0.0, fail: str | None = None, attach_seconds: float = 0.0):
        self.boot_seconds = boot_seconds
        # How long re-binding a machine takes (libvirt lookups after a vmd restart).
        self.attach_seconds = attach_seconds
        self.fail = fail
        self.machines: dict[str, LocalMachine] = {}
        self.attached: list[str] = []
        self.destroyed: list[str] = []
        self.input: list[tuple] = []

    def create(self, spec):
        if self.fail:
            raise LookupError(self.fail)
        machine = self.machines[spec.name] = LocalMachine(spec, self)
        return machine

    def attach(self, spec):
        time.sleep(self.attach_seconds)
        if spec.name not in self.machines:
            raise RuntimeError(f"the guest '{spec.name}' no longer exists.")
        self.attached.append(spec.name)
        machine = self.machines[spec.name]
        machine.factory = self
        return machine


def short_socket_dir() -> Path:
    # Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    return Path(tempfile.mkdtemp(prefix="vmd-", dir="/tmp"))


def make_config(tmp_path: Path, **overrides):
    from vmd.config import VmdConfig
    values = {"socket": short_socket_dir() / "vmd.sock", "state_dir": tmp_path / "state",
              "images_dir": tmp_path / "images", "boot_timeout_s": 30, "verify_timeout_s": 60}
    values.update(overrides)
    return VmdConfig.load(env={}, **values)
