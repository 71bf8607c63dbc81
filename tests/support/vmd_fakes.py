"""A stand-in machine for vmd tests that need no guest: commands run with bash on this
host, in the session's project folder, which is what the real guest mounts. The fake
gives no ground to the rules under test: vmd still runs the verification itself.

It has the machine port's shape (vmd/machines/port.py): a `guest` (`LocalGuest`, a
vmd.guests.guest.Guest), a `screen` (`LocalScreen`, what vmd.machines.screen.Screen offers) and the life
cycle on `LocalMachine` itself."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from vmd.contract.results import Facts
from vmd.guests.guest import CommandResult, DirEntry, FileChunk, Guest, GuestFacts
from vmd.guests.linux.x11_windows import list_x11_windows
from vmd.machines.host import LOCAL, local_host
from vmd.machines.port import MachineError, MachineSpec
from vmd.machines.screen import Shot

# A 1x1 PNG: what the fake screen shows.
PNG_1X1 = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00"
           b"\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\xff\xff?\x00\x05\xfe\x02\xfe\xa75\x81\x84"
           b"\x00\x00\x00\x00IEND\xaeB`\x82")


# The hidden check's folder in the guest (vmd/session/handlers/eval_verbs.py CHECK_ROOT).
CHECK_FOLDER = re.compile(r"/var/tmp/vmd-check-[0-9a-f]{12}")


class LocalGuest(Guest):
    """The guest's shell and files, on this host."""

    os_family = "linux"

    def __init__(self, machine: "LocalMachine"):
        self.machine = machine
        self.project_path = machine.project_path

    def _path(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.project_path) / p

    def _bash(self, command: str, cwd, timeout: float, on_output=None) -> CommandResult:
        started = time.monotonic()
        # vmd's hidden check writes its files to a folder of the guest's /var/tmp, which here
        # is the host's: removed with this machine (`LocalMachine.destroy`), as a room's disk is.
        self.machine.host_folders.update(CHECK_FOLDER.findall(command))
        proc = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=timeout)
        if on_output:
            for line in proc.stdout.splitlines():
                on_output("stdout", line)
            for line in proc.stderr.splitlines():
                on_output("stderr", line)
        return CommandResult(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr,
                             duration=round(time.monotonic() - started, 3))

    def run(self, command, timeout=300, cwd=None, on_output=None):
        self.machine.reachable()
        return self._bash(command, self._path(cwd) if cwd else self.project_path, timeout, on_output)

    def read_file(self, path, offset=0, limit=None):
        self.machine.reachable()
        data = self._path(path).read_bytes()
        chunk = data[offset: offset + limit if limit else None]
        return FileChunk(content=chunk.decode(), size=len(data), offset=offset,
                         truncated=offset + len(chunk) < len(data))

    def write_file(self, path, content):
        self.machine.reachable()
        p = self._path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content.encode() if isinstance(content, str) else content)
        return len(content.encode() if isinstance(content, str) else content)

    def append_file(self, path, content):
        self.machine.reachable()
        with open(self._path(path), "ab") as fh:
            fh.write(content.encode() if isinstance(content, str) else content)
        return len(content.encode() if isinstance(content, str) else content)

    def list_dir(self, path):
        self.machine.reachable()
        return [DirEntry(name=e.name, type="dir" if e.is_dir() else "file", size=e.stat().st_size)
                for e in sorted(self._path(path).iterdir())]

    def launch_app(self, path, args):
        return f"started {path}."

    def check_internet(self, host):
        self.machine.factory.probes.append(host)
        return False, "egress closed"

    # What the machine asks of its guest: this stand-in has no boot, share or desktop of its
    # own (LocalMachine.ready says what it has), so these answer as a headless guest would.

    def facts(self):
        return GuestFacts(os="fake linux", kernel=os.uname().release, python="", git="", desktop=False,
                          project_mounted=True, boot_id="fake", hostname="fake")

    def desktop_problem(self):
        return "this stand-in has no desktop"

    def mount_share(self):
        return None

    def restored(self, now, mount_share):
        return self.facts()

    def reboot(self):
        pass

    def forget_identity(self):
        pass

    def list_windows(self):  # X11's listing through this host's bash: without a display it says so
        return list_x11_windows(self.run)

    def close(self):
        pass


class LocalScreen:
    """The guest's screen: a 1x1 picture; input is kept in the factory's `input`, and each
    screenshot's `max_age` in its `shots`."""

    def __init__(self, machine: "LocalMachine"):
        self.machine = machine

    def screenshot(self, max_age: float = 0.0) -> Shot:
        self.machine.factory.shots.append(max_age)
        self.machine.reachable()
        return Shot(png=PNG_1X1, width=1, height=1, scale=1.0, source_width=1, source_height=1)

    def click(self, x, y, button="left", double=False):
        self.machine.factory.input.append(("click", x, y, button, double))

    def move(self, x, y):
        self.machine.factory.input.append(("move", x, y))

    def scroll(self, x, y, amount):
        self.machine.factory.input.append(("scroll", x, y, amount))

    def type(self, text):
        self.machine.factory.input.append(("type", text))

    def key(self, keys):
        if keys == "nonsense":
            raise ValueError("unknown key name 'nonsense'; use names like ctrl, alt, Return, F4.")
        self.machine.factory.input.append(("key", keys))


class LocalMachine:
    """The machine's life cycle; its `guest` and `screen` are the two classes above."""

    os_family = "linux"

    def __init__(self, spec: MachineSpec, factory: "LocalMachines"):
        self.spec = spec
        self.factory = factory
        root = spec.project_dir or Path(tempfile.mkdtemp(prefix="vmd-fake-home-"))
        self.project_path = str(root)
        # Folders of the host its guest's commands made as the guest's own: removed at its destroy.
        self.host_folders: set[str] = set()
        self.suspended = False
        self.destroyed = False
        self.egress = spec.egress
        self.egress_cut = False  # the egress link down (cut_egress), the NIC still there
        # Set by a test to play a guest destroyed from outside (or crashed): alive() says
        # so and every machine call fails the way a dropped SSH connection does.
        self.gone = False
        self.stall = None  # set by a test to a vmd.machines.port.Stall: QEMU paused the guest
        self.guest = LocalGuest(self)
        self.screen = LocalScreen(self)
        self.name = spec.name
        self.came, self.came_note = "cold", None

    def alive(self) -> bool:
        return not self.gone

    def stalled(self):
        return self.stall

    def reachable(self) -> None:
        if self.stall is not None:  # QEMU paused it on a failed write: no answer until its end
            deadline = time.monotonic() + 30
            while not self.destroyed and time.monotonic() < deadline:
                time.sleep(0.02)
            raise (ConnectionResetError("the SSH connection to the guest was reset") if self.destroyed
                   else TimeoutError("the guest did not answer: QEMU paused it"))
        if self.gone:
            raise ConnectionResetError("the SSH connection to the guest was reset")
        if self.suspended:  # a paused guest does not answer; SSH would time out
            raise TimeoutError("the guest did not answer: it is paused")

    def ready(self, timeout, desktop=False):
        # A boot that a destroy cuts short, as a real guest's SSH wait notices its guest gone
        # (vmd/machines/machine.py `_wait_for_ssh`): a close in the boot does not wait for it.
        booted = time.monotonic() + self.factory.boot_seconds
        while time.monotonic() < booted:
            if self.destroyed:
                raise MachineError(f"the guest '{self.name}' stopped while booting.")
            time.sleep(min(0.05, max(0.0, booted - time.monotonic())))
        self.reachable()
        # Whole, as the real machine's (vmd/machines/port.py Facts): vmagent's client refuses
        # a session_ready whose facts miss a field.
        return Facts(os="fake linux", kernel=os.uname().release, python="", git="", desktop=desktop,
                     project_path=self.project_path, project_mounted=self.spec.project_dir is not None,
                     boot_id="fake", hostname="fake", accel="none: a stand-in on the host").model_dump()

    def reboot(self, timeout):
        return 0.1

    def suspend(self):
        self.suspended = True

    def resume(self):
        self.suspended = False

    def destroy(self):
        self.destroyed = True
        self.factory.destroyed.append(self.spec.name)
        for folder in self.host_folders:
            shutil.rmtree(folder, ignore_errors=True)

    def set_egress(self, open_):
        self.egress = open_

    def cut_egress(self, cut):
        self.egress_cut = cut and self.egress


class LocalMachines:
    def __init__(self, boot_seconds: float = 0.0, fail: str | None = None, attach_seconds: float = 0.0,
                 came: str | None = None, os_family: str | None = "linux", desktop: bool | None = None):
        self.boot_seconds = boot_seconds
        # The family every image is said to be of, as an image manifest says it (None: as vmd
        # answers for an image it does not have). The guest still runs bash on this host.
        self.family = os_family
        # Whether the images are said to have a desktop (a manifest's `desktop`); the guest
        # has none whatever this says, as a real one whose desktop did not come up.
        self.desktop = desktop
        self.came = came  # "warm": the machines say they came from vmd's pool (cold by default)
        # How long re-binding a machine takes (libvirt lookups after a vmd restart).
        self.attach_seconds = attach_seconds
        self.fail = fail
        self.machines: dict[str, LocalMachine] = {}
        self.attached: list[str] = []
        self.destroyed: list[str] = []
        self.input: list[tuple] = []
        self.shots: list[float] = []  # each screenshot's max_age
        self.probes: list[str] = []  # the hosts check_internet probed
        self.egress_refusal: str | None = None  # what egress_problem() answers
        self.guard_missing: str | None = None  # what guard_problem() answers
        self.guard_installs = 0  # install_guard() calls (vmd's start, the guard watch)

    def host(self, name=None):
        # One host, the local one, as vmd has by default; its guests' commands run here.
        if name not in (None, LOCAL):
            raise MachineError(f"this vmd has no host named {name!r}")
        return local_host("test:///default")

    def create(self, spec):
        if self.fail:
            raise LookupError(self.fail)
        machine = self.machines[spec.name] = LocalMachine(spec, self)
        if self.came is not None:
            machine.came, machine.came_note = self.came, None
        return machine

    def egress_problem(self):
        return self.egress_refusal  # None: these machines' egress is a flag, nothing to guard

    def guard_problem(self):
        return self.guard_missing  # a test sets it to play a guard that went away

    def os_family(self, os):
        return self.family  # LocalGuest's unless a test says otherwise

    def image_desktop(self, os):
        return self.desktop  # None (as a vmd that does not say) unless a test says

    # What vmd asks of its factory besides machines: these machines run at KVM's pace, leave
    # nothing behind a cut-short create, keep no warm pool and no guest no session owns.
    def timeout_scale(self):
        return 1.0

    def discard(self, spec):
        return False

    def sweep(self, keep):
        return []

    def install_guard(self):
        self.guard_installs += 1

    def start_pool(self):
        pass

    def stop_pool(self):
        pass

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


# Every vmd of the suite keeps its clean rooms' templates (vmd/machines/room_templates.py)
# here, outside any test's folder: one template of the image serves the whole run, and the
# next, as the image cache does (a template of another build of the image is made anew).
# Its own folder in /var/tmp: vmd makes it passable for QEMU (vmd/private_fs.py passable_dir).
ROOM_TEMPLATES = Path("/var/tmp/vmagent-room-templates")


def make_config(tmp_path: Path, **overrides):
    from vmd.config import VmdConfig
    values = {"socket": short_socket_dir() / "vmd.sock", "state_dir": tmp_path / "state",
              "images_dir": tmp_path / "images", "boot_timeout_s": 30, "verify_timeout_s": 60,
              "warm_pool_size": 0,  # tests/conftest.py: no warm pool unless a test asks for one
              "room_parked": 0,  # nor parked clean rooms (each a guest's wake under TCG, beside the test's)
              "room_templates_dir": ROOM_TEMPLATES}
    values.update(overrides)
    return VmdConfig.load(env={}, **values)


@contextlib.contextmanager
def local_vmd(tmp_path: Path, machines: "LocalMachines | None" = None):
    """A real vmd server on its socket over LocalMachines: (server, machines, config)."""
    from vmd.server.rpc import VmdServer
    machines = machines if machines is not None else LocalMachines()
    config = make_config(tmp_path)
    server = VmdServer(config, machines).start()
    try:
        yield server, machines, config
    finally:
        server.stop()


class RpcError(Exception):
    """vmd's error reply, whole: code, message and data (None when vmd sent none)."""

    def __init__(self, code: int, message: str, data: dict | None = None, has_data: bool = False):
        super().__init__(message)
        self.code, self.message, self.data, self.has_data = code, message, data, has_data


class RpcClient:
    """vmd's socket spoken as the contract says, with nothing of the agent's client in
    between: a verb's result, or RpcError with the error's `data` (which the agent's
    client may not keep). Notifications go to `on_notify`."""

    def __init__(self, socket_path, timeout: float = 60, on_notify=None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(socket_path))
        self.reader = self.sock.makefile("rb")
        self.on_notify = on_notify
        self.session_id: str | None = None
        self._ids = itertools.count(1)

    def call(self, method: str, **params) -> dict:
        request_id = next(self._ids)
        self.sock.sendall(json.dumps({"id": request_id, "method": method, "params": params}).encode() + b"\n")
        while True:
            line = self.reader.readline()
            assert line.endswith(b"\n"), f"vmd closed the connection during {method}"
            reply = json.loads(line)
            if "id" not in reply:
                if self.on_notify is not None:
                    self.on_notify(reply["method"], reply.get("params") or {})
                continue
            assert reply["id"] == request_id, reply
            if "error" in reply:
                err = reply["error"]
                raise RpcError(err["code"], err["message"], err.get("data"), "data" in err)
            if method in ("session_open", "session_attach"):
                self.session_id = reply["result"]["session_id"]
            return reply["result"]

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def __enter__(self) -> "RpcClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SilentVmd:
    """A socket that takes connections and never answers: a stuck vmd."""

    def __init__(self):
        self.path = short_socket_dir() / "stuck.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        self.sock.listen(8)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        with contextlib.suppress(OSError):
            while True:
                self.held.append(self.sock.accept()[0])

    def close(self):
        for s in [self.sock, *self.held]:
            s.close()
