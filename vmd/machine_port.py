"""The machine port: what a session needs of a machine (`SessionMachine`), how one is
made (`MachineFactory`, from a `MachineSpec`), and the default adapter over libvirt
(vmd/machine.py: libvirt + SSH + QMP). Tests hand a session another factory
(tests/vmd_fakes.py); the OS-specific guest commands (launch_app, check_internet) live
in the adapter, not in the verb handlers.
"""

from __future__ import annotations

import secrets
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from vmd.config import VmdConfig
from vmd.errors import VerbError


@dataclass
class MachineSpec:
    session_id: str
    os: str
    name: str  # the libvirt domain name
    workdir: Path
    project_dir: Path | None
    egress: bool = False


class SessionMachine(Protocol):
    """What a session needs of a machine; the only door to the guest."""

    os_family: str
    project_path: str

    def ready(self, timeout: float, desktop: bool = False) -> dict: ...
    def run(self, command: str, timeout: float, cwd: str | None,
            on_output: Callable[[str, str], None] | None) -> dict: ...
    def read_file(self, path: str, offset: int, limit: int | None) -> dict: ...
    def write_file(self, path: str, content: str) -> int: ...
    def append_file(self, path: str, content: str) -> int: ...
    def edit_file(self, path: str, old: str, new: str) -> None: ...
    def list_dir(self, path: str) -> list[dict]: ...
    def screenshot(self) -> dict: ...  # png (bytes), width, height, scale
    def click(self, x: int, y: int, button: str, double: bool) -> None: ...
    def move(self, x: int, y: int) -> None: ...
    def scroll(self, x: int, y: int, amount: int) -> None: ...
    def type(self, text: str) -> None: ...
    def key(self, keys: str) -> None: ...
    def launch_app(self, path: str, args: list[str]) -> str: ...
    def check_internet(self) -> tuple[bool, str]: ...
    def reboot(self, timeout: float) -> float: ...
    def suspend(self) -> None: ...
    def resume(self) -> None: ...
    def destroy(self) -> None: ...


class MachineFactory(Protocol):
    def create(self, spec: MachineSpec) -> SessionMachine: ...
    def attach(self, spec: MachineSpec) -> SessionMachine: ...


class LibvirtMachine:
    """SessionMachine over vmd.machine.Machine (libvirt + SSH + QMP)."""

    def __init__(self, machine, image, desktop_wait_s: float = 30.0, internet_probe: str = "example.com"):
        self.machine = machine
        self.image = image
        self.os_family = image.os_family
        self.project_path = image.project_path
        # vmd/config.py says why: desktop_wait_s, internet_probe.
        self.desktop_wait_s = desktop_wait_s
        self.internet_probe = internet_probe

    def ready(self, timeout, desktop=False):
        """SSH, and the desktop when the image has one: the machine is handed over with a
        usable screen, so the agent's first screenshot shows it. A desktop that does not
        come up leaves a shell-only machine (facts say desktop false), not a failed boot."""
        from vmd.machine import DesktopMissing, timeout_scale

        try:
            facts = self.machine.ready(timeout, desktop=True,
                                       desktop_timeout=self.desktop_wait_s * timeout_scale(self.machine.accel))
        except DesktopMissing as exc:
            facts = self.machine.read_facts()
            facts.desktop = False
            facts.seconds = round(time.monotonic() - self.machine.started, 1)
            return {**facts.model_dump(), "desktop_problem": str(exc)}
        return facts.model_dump()

    def run(self, command, timeout, cwd, on_output):
        return self.machine.guest.run(command, timeout=timeout, cwd=cwd, on_output=on_output).model_dump()

    def read_file(self, path, offset, limit):
        return self.machine.guest.read_file(path, offset, limit).model_dump()

    def run_baseline(self, command, archive, timeout):
        """The check with the project path showing the baseline (vmd/verification.py)."""
        from vmd.verification import linux_baseline_command
        if self.os_family != "linux":
            raise NotImplementedError(f"a baseline run on {self.os_family} guests")
        path = f"/tmp/vmd-baseline-{secrets.token_hex(4)}.tar"
        self.machine.guest.write_file(path, archive)
        line = linux_baseline_command(command, self.project_path, self.image.user, path)
        return self.machine.guest.run(line, timeout=timeout).model_dump()

    def write_file(self, path, content):
        return self.machine.guest.write_file(path, content)

    def append_file(self, path, content):
        return self.machine.guest.append_file(path, content)

    def edit_file(self, path, old, new):
        self.machine.guest.edit_file(path, old, new)

    def list_dir(self, path):
        return [e.model_dump() for e in self.machine.guest.list_dir(path)]

    def screenshot(self):
        shot = self.machine.screen.screenshot()
        return {"png": shot.png, "width": shot.width, "height": shot.height, "scale": shot.scale}

    def click(self, x, y, button, double):
        self.machine.screen.click(x, y, button=button, double=double)

    def move(self, x, y):
        self.machine.screen.move(x, y)

    def scroll(self, x, y, amount):
        self.machine.screen.scroll(x, y, amount)

    def type(self, text):
        self.machine.screen.type(text)

    def key(self, keys):
        self.machine.screen.key(keys)

    def launch_app(self, path, args):
        if self.os_family == "windows":
            # Programs started over SSH land in session 0 and are invisible: start them in
            # the logged-on user's session through a scheduled task run interactively.
            line = subprocess.list2cmdline([path, *args])
            command = (f"schtasks /Create /F /TN vmagent-launch /SC ONCE /ST 00:00 /IT /TR '{line}'; "
                       "schtasks /Run /TN vmagent-launch")
        else:
            command = ("DISPLAY=:0 setsid -f " + " ".join(shlex.quote(a) for a in [path, *args])
                       + " >/tmp/vmagent-launch.log 2>&1 </dev/null")
        result = self.machine.guest.run(command, timeout=30)
        if result.exit_code != 0:
            raise VerbError(f"could not start {path}: exit {result.exit_code}: "
                            f"{(result.stderr or result.stdout).strip()[-400:]}")
        return f"started {path}; take a screenshot to see its window."

    def check_internet(self):
        host = self.internet_probe
        if self.os_family == "windows":
            command = ("try { (Invoke-WebRequest -UseBasicParsing -TimeoutSec 8 "
                       f"http://{host}/ -Method Head).StatusCode }} catch {{ exit 1 }}")
        else:
            command = f"timeout 8 bash -c 'exec 3<>/dev/tcp/{host}/80' && echo reachable"
        result = self.machine.guest.run(command, timeout=20)
        return result.exit_code == 0, (result.stdout + result.stderr).strip()[-300:]

    def reboot(self, timeout):
        return self.machine.reboot(timeout)

    def suspend(self):
        self.machine.suspend()

    def resume(self):
        self.machine.resume()

    def destroy(self):
        self.machine.destroy()

    def alive(self) -> bool:
        return self.machine.state() in ("running", "paused")

    def set_egress(self, open_: bool) -> None:
        self.machine.set_egress(open_)


class LibvirtMachines:
    """The default MachineFactory: an image from the images dir, a domain in libvirt."""

    def __init__(self, config: VmdConfig):
        self.config = config

    def timeout_scale(self) -> float:
        from vmd.machine import timeout_scale
        return timeout_scale()

    def _adapter(self, machine, image) -> LibvirtMachine:
        return LibvirtMachine(machine, image, desktop_wait_s=self.config.desktop_wait_s,
                              internet_probe=self.config.internet_probe)

    def _image(self, spec: MachineSpec):
        from vmd.images import find_image  # lazily: tests without libvirt never import it
        return find_image(spec.os, self.config.images_dir)

    def create(self, spec: MachineSpec) -> SessionMachine:
        image = self._image(spec)
        from vmd.machine import Machine
        machine = Machine.create(image, name=spec.name, workdir=spec.workdir, project_dir=spec.project_dir,
                                 uri=self.config.libvirt_uri, egress=spec.egress,
                                 qemu_user=self.config.share_user)
        return self._adapter(machine, image)

    def attach(self, spec: MachineSpec) -> SessionMachine:
        image = self._image(spec)
        from vmd.machine import Machine
        machine = Machine.attach(image, name=spec.name, workdir=spec.workdir, project_dir=spec.project_dir,
                                 uri=self.config.libvirt_uri)
        return self._adapter(machine, image)

    def discard(self, spec: MachineSpec) -> bool:
        """Destroys what a create cut short left in libvirt (a domain defined or started
        after the session's close began); True when there was one."""
        from vmd.machine import Machine
        return Machine.discard(spec.name, spec.workdir, self.config.libvirt_uri)

    def sweep(self, keep: Callable[[str], bool]) -> list[str]:
        """Destroys and undefines the guests of this vmd's state dir that no session owns
        any more (`keep(name)` is False): no guest may run without a live or pending session.
        Only domains whose XML names a file under this vmd's sessions dir are looked at, so
        the guests of another vmd on the same libvirt are never touched. Returns the names
        destroyed; libvirt unreachable is no error here (the next sweep tries again)."""
        import libvirt
        marker = f"{self.config.sessions_dir}/"
        try:
            conn = libvirt.open(self.config.libvirt_uri)
        except libvirt.libvirtError:
            return []
        destroyed = []
        try:
            for domain in conn.listAllDomains():
                try:
                    name = domain.name()
                    if not name.startswith("vmagent-") or marker not in domain.XMLDesc(0) or keep(name):
                        continue
                    if domain.isActive():
                        domain.destroy()
                    domain.undefine()
                except libvirt.libvirtError:
                    continue
                overlay = self.config.sessions_dir / name.removeprefix("vmagent-") / "machine" / "overlay.qcow2"
                overlay.unlink(missing_ok=True)
                destroyed.append(name)
        finally:
            conn.close()
        return destroyed
