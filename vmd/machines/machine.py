"""A machine: one libvirt domain on a qcow2 overlay of a read-only image.

Create returns as soon as the domain is started so that the agent can plan while the
guest boots; `ready()` waits for SSH. Destroy leaves nothing behind: no domain, no
overlay, no QEMU process (and so no forwarded port).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import libvirt_qemu
import paramiko

from vmd.config import VmdConfig
from vmd.contract.shown_text import one_line
from vmd.guests.families import guest_class
from vmd.guests.guest import Guest, GuestError, GuestFacts, ShareLogin
from vmd.guests.output import OutputBounds
from vmd.guests.ssh import SshConnection
from vmd.host_env import clean_env
from vmd.machines.accel import config_accel
from vmd.machines.accel import timeout_scale as scale_for
from vmd.machines.boot_share import nic_driver, share_for
from vmd.machines.device_set import device_set
from vmd.machines.domain_xml import (EGRESS_NET, HOTPLUG_PORT, RunAs, SerialLog,
                                     VmdOwner, nic_macs, ssh_port_of)
from vmd.machines.host import DEFAULT_URI, Host, local_host
from vmd.machines.images import Image
from vmd.machines.port import DesktopMissing, Facts, MachineError, Stall
from vmd.machines.qemu_access import check_reachable, make_screen_dir
from vmd.machines.screen import Screen
from vmd.machines.smb_share import relay_for, release_share, share_account
from vmd.private_fs import open_private, passable_dir, private_file, write_private
from vmd.projects.tree import share_owner


log = logging.getLogger("vmd.machines.machine")


def accel(config: VmdConfig | None = None) -> str:
    """"kvm" or "qemu" for the next guest under `config` (its accel and images_dir); None:
    the settings in effect (VMD_CONFIG, VMD_ACCEL), for a caller without vmd's config at
    hand (the tests' and the benchmark's machines)."""
    return config_accel(config if config is not None else VmdConfig.load())


def timeout_scale(acc: str | None = None) -> float:
    """vmd.machines.accel.timeout_scale of a guest run with `acc`, or of the next guest."""
    return scale_for(acc or accel())


def connect(uri: str = DEFAULT_URI) -> libvirt.virConnect:
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise MachineError(
            f"cannot reach libvirt at {uri} ({exc.get_error_message()}). Start it with "
            "`virtlogd -d; libvirtd -d` (or `systemctl start libvirtd`), or set VMD_LIBVIRT_URI."
        ) from None


@contextlib.contextmanager
def _quiet_logger(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Machine:
    def __init__(self, image: Image, *, name: str, workdir: Path, project_dir: Path | None,
                 host: Host, domain: libvirt.virDomain, ssh_port: int, accel: str, config: VmdConfig):
        self.image = image
        self.name = name
        self.workdir = workdir
        self.project_dir = project_dir
        self.host = host  # where it runs (vmd/machines/host.py): libvirt, SSH, screen dumps
        self.domain = domain
        self.ssh_port = ssh_port
        self.accel = accel
        self.started = time.monotonic()
        self.ssh = SshConnection(host.ssh_address, ssh_port, image.user, str(image.path("ssh_key")))
        self.guest: Guest = guest_class(image.os_family)(self.ssh, image.project_path)
        self.guest.output = OutputBounds.of(config)  # what a command returns of its output
        self.screen = Screen(domain, tuple(image.resolution), dump_path=host.screen_dump(workdir))
        self.facts: Facts | None = None
        self.restored = False  # handed out from the warm pool (vmd/machines/warm_pool.py)
        # A parked slot handed out (vmd/machines/parked_slot.py): the facts read when it was
        # woken, before it was paused; its first `ready` only sets the clock.
        self.woken: Facts | None = None
        self.libvirt_disk: Path | None = None  # a parked slot's disk's first path (moved_to)
        # A project over SMB: vmd's relay to smbd, found in the XML, so a restarted vmd relays
        # again, and the share's login, with which the guest maps it.
        self.smb_relay = relay_for(domain, workdir, config.smb_max_starts)
        self.guest.share = "smb" if self.smb_relay is not None else "9p"
        if self.smb_relay is not None and (account := share_account(workdir)) is not None:
            self.guest.share_login = ShareLogin(user=account.user, password=account.password)

    # --- life cycle ---------------------------------------------------------------------

    @classmethod
    def create(cls, image: Image, *, name: str, workdir: Path, project_dir: Path | None,
               host: Host | None = None, uri: str = DEFAULT_URI, egress: bool = False,
               qemu_user: str = "libvirt-qemu", config: VmdConfig | None = None,
               owner: VmdOwner | None = None, share: str | None = None) -> "Machine":
        """`host`: where it runs (the local host at `uri` when None). `config`: vmd's, for the
        guest's memory and vCPUs, its accelerator and what a command returns of its output;
        None: the settings in effect, for callers without vmd's config (tests, the benchmark).
        `owner`: the vmd and session the domain belongs to, kept in its <metadata>, by which
        vmd's sweep tells its own guests (vmd/machines/libvirt_machines.py `sweep`)."""
        host = host or local_host(uri)
        uri = host.libvirt_uri
        config = config if config is not None else VmdConfig.load()
        try:
            guest_class(image.os_family)
        except GuestError as exc:
            raise MachineError(f"the image '{image.name}' is {image.os_family}: {exc}") from None
        for part, what in (("disk", "disk"), ("ssh_key", "SSH key for its guest")):
            if not image.path(part).is_file():
                raise MachineError(f"the image '{image.name}' has no {what} at {image.path(part)}; rebuild it "
                                   f"with `vmd images build {image.name}`.")
        base = image.path("disk")
        conn = connect(uri)
        run_as = share_owner(qemu_user)
        # QEMU passes through to the overlay and console log (which libvirt's DAC relabelling
        # hands to its user while the guest runs); domain.xml and the rest stay vmd's.
        passable_dir(workdir, run_as[1] if run_as else None)
        if run_as is not None and uri.startswith("qemu"):  # the test driver runs no QEMU
            for place in (workdir, project_dir, base):
                if place is not None:
                    check_reachable(Path(place), *run_as, qemu_user)
        make_screen_dir(host, workdir, run_as)
        overlay = workdir / "overlay.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "qcow2",
                        str(overlay)], check=True, capture_output=True, env=clean_env())
        private_file(overlay)  # qemu-img follows the umask; the guest's disk is nobody else's
        os.close(open_private(workdir / "console.log"))  # QEMU appends; libvirt gives it the file
        acc = accel(config)
        port = free_port()
        ssh_mac, egress_mac = nic_macs(name)
        # The boot and the share from the image's manifest (`share`: a test's choice over it).
        shared = share_for(image, project_dir, workdir, run_as, share)
        # The image's devices, the same as the Windows install's (device_set.py says why).
        devices = device_set(image, overlay, workdir)
        spec = devices.domain(
            name=name, memory_mib=config.guest_memory_mib, vcpus=config.guest_vcpus, accel=acc,
            network=devices.network(port, ssh_mac, egress_mac, egress=egress),
            shared=shared,
            serial=SerialLog(str(workdir / "console.log")),
            description=f"vmagent guest from image {image.dir.name}",
            run_as=RunAs(*run_as) if run_as else None,
            owner=owner,
        )
        write_private(workdir / "domain.xml", spec.to_xml())
        try:
            domain = conn.defineXML(spec.to_xml())
            domain.create()
        except libvirt.libvirtError as exc:
            try:
                undefine(conn.lookupByName(name))
            except libvirt.libvirtError:
                pass
            shutil.rmtree(workdir, ignore_errors=True)
            raise MachineError(f"libvirt could not start the guest '{name}': "
                               f"{exc.get_error_message()}") from None
        try:
            return cls(image, name=name, workdir=workdir, project_dir=project_dir, host=host,
                       domain=domain, ssh_port=port, accel=acc, config=config)
        except Exception as exc:  # the guest runs already: it must not outlive the failure
            _remove(domain, workdir, host)
            raise MachineError(f"the guest '{name}' started but vmd could not take it over "
                               f"({type(exc).__name__}: {exc}); it was destroyed.") from None

    @classmethod
    def adopt_restored(cls, image: Image, *, name: str, workdir: Path, project_dir: Path | None, host: Host,
                       domain: libvirt.virDomain, ssh_port: int, accel: str, config: VmdConfig,
                       qemu_user: str = "libvirt-qemu") -> "Machine":
        """A guest vmd.machines.warm_pool restored into `workdir`: its `ready` sets the clock, which
        stood still while it was saved."""
        make_screen_dir(host, workdir, share_owner(qemu_user))
        machine = cls(image, name=name, workdir=workdir, project_dir=project_dir, host=host,
                      domain=domain, ssh_port=ssh_port, accel=accel, config=config)
        machine.restored = True
        return machine

    def moved_to(self, workdir: Path, project_dir: Path | None, woken: Facts) -> None:
        """A parked slot's machine (vmd/machines/parked_slot.py) given to a session: its folder
        renamed to `workdir`, its share now `project_dir`, its guest woken with `woken` as its
        facts; its `ready` from now on counts from here."""
        self.libvirt_disk = self.workdir / "overlay.qcow2"  # where libvirt still knows it by
        self.workdir = workdir
        self.project_dir = project_dir
        self.screen = Screen(self.domain, tuple(self.image.resolution), dump_path=self.host.screen_dump(workdir))
        self.woken = woken
        self.restored = False  # woken already: a later `ready` (a reboot's) is a boot's
        self.started = time.monotonic()

    @classmethod
    def attach(cls, image: Image, *, name: str, workdir: Path, project_dir: Path | None,
               host: Host | None = None, uri: str = DEFAULT_URI, config: VmdConfig | None = None) -> "Machine":
        """Re-bind to a domain that outlived a vmd restart (on `host`, else the local host at
        `uri`); `config` as for `create`."""
        host = host or local_host(uri)
        conn = connect(host.libvirt_uri)
        try:
            domain = conn.lookupByName(name)
        except libvirt.libvirtError:
            raise MachineError(f"the guest '{name}' no longer exists; its work is in the project "
                               "folder, open a new session to carry on.") from None
        root = ET.fromstring(domain.XMLDesc(0))
        port = ssh_port_of(root)
        if port is None:
            raise MachineError(f"the guest '{name}' has no SSH forward; it was not made by vmd.")
        acc = "kvm" if root.get("type") == "kvm" else "qemu"
        return cls(image, name=name, workdir=workdir, project_dir=project_dir, host=host,
                   domain=domain, ssh_port=port, accel=acc,
                   config=config if config is not None else VmdConfig.load())

    def alive(self) -> bool:
        try:
            return self.domain.isActive() == 1
        except libvirt.libvirtError:
            return False

    def state(self) -> str:
        try:
            code = self.domain.state()[0]
        except libvirt.libvirtError:
            return "gone"
        return {libvirt.VIR_DOMAIN_RUNNING: "running", libvirt.VIR_DOMAIN_PAUSED: "paused",
                libvirt.VIR_DOMAIN_SHUTOFF: "shutoff"}.get(code, "other")

    def stalled(self) -> Stall | None:
        """Why QEMU paused the guest on its own, or None: a disk write that failed on the
        host (the overlay could not grow: the host's disk is full; or an I/O error) pauses
        the guest (QEMU's default werror=enospc, libvirt's default error policy), and it
        answers nothing until the cause is gone."""
        try:
            code, reason = self.domain.state()
            if code != libvirt.VIR_DOMAIN_PAUSED or reason != libvirt.VIR_DOMAIN_PAUSED_IOERROR:
                return None
            errors = self.domain.diskErrors()
        except libvirt.libvirtError:
            return None
        no_space = sorted(dev for dev, err in errors.items() if err == libvirt.VIR_DOMAIN_DISK_ERROR_NO_SPACE)
        return Stall(no_space=bool(no_space), disks=no_space or sorted(errors))

    def ready(self, timeout: float, desktop: bool = False, desktop_timeout: float | None = None) -> Facts:
        """Wait until the guest answers over SSH (and its desktop is up, if asked: at most
        `desktop_timeout` more seconds, then DesktopMissing)."""
        if self.woken is not None:
            facts = self._ready_parked()
            if facts is not None:
                return facts
        deadline = time.monotonic() + timeout
        # While sshd is not up, paramiko's transport thread logs each refused banner as an
        # ERROR with a traceback; those are expected here and would drown real output.
        with _quiet_logger("paramiko.transport"):
            self._wait_for_ssh(deadline, timeout)
        if self.restored:
            facts = self._ready_restored()
            if facts is not None:
                return facts
        share_problem = self.guest.mount_share() if self.project_dir is not None else None
        if desktop and self.image.desktop:
            if desktop_timeout is not None:
                deadline = min(deadline, time.monotonic() + desktop_timeout)
            while (problem := self.guest.desktop_problem()) is not None:
                if time.monotonic() > deadline:
                    raise DesktopMissing(
                        f"the guest '{self.name}' answers over SSH but its desktop did not come up "
                        f"within {timeout:.0f} s ({problem}); use the shell, or reboot_vm.")
                time.sleep(1.0)
        self.facts = self._share_checked(self.read_facts(), share_problem)
        self.facts.seconds = round(time.monotonic() - self.started, 1)
        return self.facts

    def _share_checked(self, facts: Facts, problem: str | None = None) -> Facts:
        """`facts` of a guest whose project share is mounted; else MachineError with why not:
        a guest without it writes the project nowhere the host keeps (a command's `Z:\\`,
        SFTP to it and the finish check all fail)."""
        if self.project_dir is None or facts.project_mounted:
            return facts
        capped = self.smb_relay is not None and self.smb_relay.capped
        why = ("the guest used up its SMB connections (smb_max_starts)" if capped
               else problem or "the guest did not say why")
        raise MachineError(f"the guest '{self.name}' is up but its project share is not mounted at "
                           f"{self.image.project_path} ({one_line(why)[:400]}); nothing it wrote would be kept. "
                           "Reboot the machine (reboot_vm) or open a new session.")

    def _wait_for_ssh(self, deadline: float, timeout: float) -> None:
        last_error = "no answer yet"
        while True:
            if not self.alive():
                raise MachineError(f"the guest '{self.name}' stopped while booting. "
                                   f"Last console lines:\n{self.console_tail()}")
            try:
                self.ssh.transport()
                return
            except (OSError, paramiko.SSHException, EOFError) as exc:
                last_error = str(exc) or type(exc).__name__
            if time.monotonic() > deadline:
                raise MachineError(
                    f"the guest '{self.name}' did not answer over SSH within {timeout:.0f} s "
                    f"({last_error}). Give session_ready a longer timeout, or destroy the session "
                    f"and open a new one. Last console lines:\n{self.console_tail()}")
            time.sleep(1.0)

    def _ready_restored(self) -> Facts | None:
        """A warm machine (vmd/machines/warm_pool.py): its guest woken in one command (clock,
        share, facts: `Guest.restored`); its desktop was checked before the save. None when
        the desktop is not there: the usual checks follow."""
        facts = self._facts(self.guest.restored(time.time(), mount_share=self.project_dir is not None))
        if self.image.desktop and not facts.desktop:
            return None
        self.facts = self._share_checked(facts)
        self.facts.seconds = round(time.monotonic() - self.started, 1)
        return self.facts

    def _ready_parked(self) -> Facts | None:
        """A parked slot handed out (vmd/machines/parked_slot.py): woken and its desktop seen
        before it was paused, its SSH transport and a command runner kept open; here its clock
        is set and its share looked at in one command through that runner. Its other facts
        are those of the parking: the guest ran nothing since. Once: after a reboot the
        usual checks run. None when that command failed: then a restored guest's checks
        follow (a new connection, the clock, the share, the facts)."""
        woken, self.woken = self.woken, None
        try:
            mounted = self.guest.resumed(time.time())
        except (GuestError, OSError, paramiko.SSHException, EOFError) as exc:
            log.warning("the parked guest %s did not answer through its kept connection (%s); it is woken "
                        "as a restored one", self.name, exc)
            self.restored = True
            return None
        if not mounted and self.project_dir is not None:
            self.guest.mount_share()
            self.facts = self.read_facts()
        else:
            self.facts = woken.model_copy(update={"project_mounted": mounted})
        self.facts.seconds = round(time.monotonic() - self.started, 1)
        return self.facts

    def read_facts(self) -> Facts:
        """The guest's facts (`Guest.facts`) with the machine's own."""
        return self._facts(self.guest.facts())

    def _facts(self, guest: GuestFacts) -> Facts:
        return Facts(**guest.model_dump(), project_path=self.image.project_path, accel=self.accel)

    def console_tail(self, lines: int = 15) -> str:
        path = self.workdir / "console.log"
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return "(no console log)"
        return "\n".join(text.splitlines()[-lines:]) or "(console log empty)"

    # --- egress -------------------------------------------------------------------------

    def _qmp(self, execute: str, **arguments) -> dict:
        command = json.dumps({"execute": execute, "arguments": arguments} if arguments else {"execute": execute})
        reply = json.loads(libvirt_qemu.qemuMonitorCommand(self.domain, command, 0))
        if "error" in reply:
            raise MachineError(f"QEMU refused {execute}: {reply['error'].get('desc', reply['error'])}")
        return reply.get("return", {})

    def egress_open(self) -> bool:
        peripherals = self._qmp("qom-list", path="/machine/peripheral")
        return any(p.get("name") == "vmdegressnic" for p in peripherals)

    def set_egress(self, open_: bool) -> None:
        """Open or close the guest's way out by hot-plugging its egress NIC.

        The SSH NIC stays restricted either way; the guest gives any NIC but the SSH one
        (which it knows by its PCI slot) a default route and DNS as soon as it appears."""
        if open_ == self.egress_open():
            return
        if open_:
            self._qmp("netdev_add", type="user", id="vmdegress", net=EGRESS_NET)
            self._qmp("device_add", driver=nic_driver(self.image), netdev="vmdegress", mac=nic_macs(self.name)[1],
                      id="vmdegressnic", bus=HOTPLUG_PORT)
        else:
            self._qmp("device_del", id="vmdegressnic")
            deadline = time.monotonic() + 30 * timeout_scale(self.accel)
            while self.egress_open() and time.monotonic() < deadline:
                time.sleep(0.5)  # the guest must let go of the device before its netdev goes
            self._qmp("netdev_del", id="vmdegress")

    def cut_egress(self, cut: bool) -> None:
        """The egress NIC's link down (cut) or up, at once, without the guest (guard_watch.py)."""
        if self.egress_open():
            self._qmp("set_link", name="vmdegressnic", up=not cut)

    def suspend(self) -> None:
        self.ssh.close()
        if self.state() == "running":
            self.domain.suspend()

    def resume(self) -> None:
        if self.state() == "paused":
            self.domain.resume()

    def reboot(self, timeout: float) -> float:
        started = time.monotonic()
        try:
            self.guest.reboot()
        except (GuestError, OSError, paramiko.SSHException, EOFError):
            pass
        self.ssh.close()
        time.sleep(3)
        self.started = time.monotonic()
        self.ready(timeout)
        return round(time.monotonic() - started, 1)

    def destroy(self) -> None:
        # The domain goes first: a boot thread may hold the SSH lock while it connects to a
        # guest still booting (up to its connect timeout), and the guest's end is what
        # frees it. A close during boot must not wait for that.
        back = self._disk_back_for_libvirt()
        _remove(self.domain, self.workdir, self.host)
        if back is not None:
            back.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                back.parent.rmdir()
        self.ssh.close()
        if self.smb_relay is not None:
            self.smb_relay.stop()

    def _disk_back_for_libvirt(self) -> Path | None:
        """A parked slot's disk, for its destroy, moved back to the path libvirt started it with
        (its folder was renamed at the hand-out: `moved_to`), or None. libvirt removes its own
        attributes from a disk by that path when the guest stops, and logged two errors and a
        warning for each parked guest's disk it did not find there. The guest goes away next
        whatever happens: a vmd that dies meanwhile leaves a `.parked` folder that the next
        one's pool removes with what it finds of the guest."""
        old, here = self.libvirt_disk, self.workdir / "overlay.qcow2"
        if old is None or not here.exists() or old.parent.exists():
            return None
        try:
            old.parent.mkdir(mode=0o700)
            os.rename(here, old)
        except OSError:
            return None
        return old

    @staticmethod
    def discard(name: str, workdir: Path, host: Host) -> bool:
        """Destroys and undefines the domain `name` if `host`'s libvirt has one, and its
        overlay: for what a create left behind when it was cut short. True when there was a domain."""
        conn = connect(host.libvirt_uri)
        try:
            try:
                domain = conn.lookupByName(name)
            except libvirt.libvirtError:
                return False
            _remove(domain, workdir, host)
            return True
        finally:
            conn.close()


def undefine(domain: libvirt.virDomain) -> None:
    """Undefines `domain` with a UEFI guest's variable store and a TPM's state (a plain
    undefine refuses a domain with an nvram file); libvirt's test driver knows neither flag."""
    try:
        domain.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_TPM)
    except libvirt.libvirtError:
        domain.undefine()


def _remove(domain: libvirt.virDomain, workdir: Path, host: Host) -> None:
    """All vmd made for one guest: its domain destroyed and undefined (a warm machine's
    restored domain is transient, gone once destroyed), its overlay and its screen folder
    (the last frame is the guest's)."""
    persistent = True
    try:
        persistent = domain.isPersistent() == 1  # asked first: a transient one is gone after destroy
        if domain.isActive():
            domain.destroy()
    except libvirt.libvirtError:
        pass
    if persistent:
        try:
            undefine(domain)
        except libvirt.libvirtError:
            pass
    (workdir / "overlay.qcow2").unlink(missing_ok=True)
    release_share(workdir)  # its uid free again, its password gone
    screen_dir = host.screen_dir(workdir)
    if screen_dir is not None:
        shutil.rmtree(screen_dir, ignore_errors=True)
