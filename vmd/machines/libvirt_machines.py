"""The default machine factory: a domain in libvirt per session (vmd/machines/machine.py:
libvirt + SSH + QMP), from an image of the images dir, on one of its hosts
(vmd/machines/host.py; the local one by default), warm from that host's pool
(vmd/machines/warm_pool.py) when it has one. `LibvirtMachines` is a `MachineFactory`,
`LibvirtMachine` a `SessionMachine` (vmd/machines/port.py)."""

from __future__ import annotations

import logging
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

import libvirt

from vmd.config import VmdConfig
from vmd.contract.params import SESSION_ID
from vmd.guests.guest import Guest
from vmd.machines.domain_life import undefine
from vmd.machines.domain_xml import VmdOwner, vmd_owner
from vmd.machines.egress_guard import EgressGuard, EgressGuardError
from vmd.machines.host import Host, local_host
from vmd.machines.images import ImageMissing, find_image
from vmd.machines.machine import Machine, accel, timeout_scale
from vmd.machines.port import DesktopMissing, MachineError, MachineSpec, SessionMachine
from vmd.machines.parked_rooms import ParkedRooms
from vmd.machines.room_templates import RoomTemplates
from vmd.machines.screen import Screen
from vmd.machines.warm_pool import WarmPool

log = logging.getLogger("vmd.machines.libvirt_machines")


class LibvirtMachine:
    """SessionMachine over vmd.machines.machine.Machine (libvirt + SSH + QMP). Its guest, screen,
    reboot, suspend, resume, destroy and set_egress are the Machine's own; only `ready`
    (the desktop, or a shell-only machine) and `alive` are made here."""

    def __init__(self, machine, image, desktop_wait_s: float = 30.0, came: str = "cold",
                 came_note: str | None = None, guard: EgressGuard | None = None):
        self.machine = machine
        self.name = machine.name  # a warm machine keeps its slot's domain name
        self.came = came  # "warm" (restored from the pool) or "cold" (booted)
        self.came_note = came_note  # why a session that could have come warm came cold
        self.guest: Guest = machine.guest
        self.screen: Screen = machine.screen
        self.os_family = image.os_family
        self.project_path = image.project_path
        self.desktop_wait_s = desktop_wait_s  # vmd/config/settings.py says why
        self.reboot = machine.reboot
        self.suspend = machine.suspend
        self.resume = machine.resume
        self.destroy = machine.destroy
        self.stalled = machine.stalled
        self.cut_egress = machine.cut_egress
        self.guard = guard

    def set_egress(self, open_: bool) -> None:
        if open_ and self.guard is not None:
            self.guard.require()  # raises EgressGuardError with what to install
        self.machine.set_egress(open_)

    def ready(self, timeout, desktop=False):
        """SSH, and the desktop when the image has one: the machine is handed over with a
        usable screen, so the agent's first screenshot shows it. A desktop that does not
        come up leaves a shell-only machine (facts say desktop false), not a failed boot."""
        try:
            facts = self.machine.ready(timeout, desktop=True,
                                       desktop_timeout=self.desktop_wait_s * timeout_scale(self.machine.accel))
        except DesktopMissing as exc:
            facts = self.machine.read_facts()
            facts.desktop = False
            facts.seconds = round(time.monotonic() - self.machine.started, 1)
            return {**facts.model_dump(), "desktop_problem": str(exc)}
        return facts.model_dump()

    def alive(self) -> bool:
        # Not Machine.alive() (libvirt's "active"): a domain shutting down or suspended by
        # its own power management is active but answers nothing, and the session's
        # "the machine is gone" sentence is what fits it.
        return self.machine.state() in ("running", "paused")


class LibvirtMachines:
    """The default MachineFactory: an image from the images dir, a domain in libvirt on one
    of `hosts` (the first takes new sessions; by default the local host of the config)."""

    def __init__(self, config: VmdConfig, hosts: list[Host] | None = None):
        self.config = config
        self.hosts = {h.name: h for h in (hosts or [local_host(config.libvirt_uri)])}
        self.pools: dict[str, WarmPool] = {}  # per host name, once started (start_pool)
        self.templates = {h.name: RoomTemplates(config, h) for h in self.hosts.values()}
        self.parked_rooms = {h.name: ParkedRooms(config, h, self.templates[h.name]) for h in self.hosts.values()}
        self.guard = EgressGuard.from_config(config)

    def host(self, name: str | None = None) -> Host:
        if name is None:
            return next(iter(self.hosts.values()))
        try:
            return self.hosts[name]
        except KeyError:
            raise MachineError(f"this vmd has no host named {name!r} (it has {', '.join(self.hosts)}); "
                               "the session's guest is on a host missing from its configuration: add the "
                               "host back, or close the session.") from None

    @property
    def pool(self) -> WarmPool | None:
        """The first host's warm pool (where new sessions go), or None."""
        return self.pools.get(self.host().name)

    def _host_of(self, spec: MachineSpec) -> Host:
        return spec.host if spec.host is not None else self.host()

    def install_guard(self) -> None:
        """At vmd's start: the egress guard in place before any guest can ask for egress
        (rules do not survive a host reboot). Failing is no reason not to serve: egress
        is then refused, with the sentence, until it is fixed."""
        try:
            self.guard.install()
        except EgressGuardError as exc:
            log.warning("egress guard: %s; approved egress will be refused until it is installed", exc)

    def guard_problem(self) -> str | None:
        """Whether the guard in force is this configuration's, asked without putting it back."""
        return self.guard.problem()

    def egress_problem(self) -> str | None:
        try:
            self.guard.require()
        except EgressGuardError as exc:
            return str(exc)
        return None

    def start_pool(self) -> None:
        """One warm pool per host, each sized for its host when the size is "auto"."""
        for host in self.hosts.values():
            if host.name in self.pools:
                continue
            size = self.config.warm_pool_size
            if size == "auto":
                size = host.room.pool_size(self.config.guest_memory_mib)
                log.info("warm pool: %d slot(s), sized for the host %s", size, host.name)
            pool = WarmPool(self.config, host, size)
            if size <= 0:
                pool.clear()  # an earlier vmd's slots: their disk back, half-made guests destroyed
                continue
            self.pools[host.name] = pool.start(lambda: find_image(self.config.default_os, self.config.images_dir))

    def stop_pool(self) -> None:
        for pool in self.pools.values():
            pool.stop()
        for rooms in self.parked_rooms.values():
            rooms.stop()

    def timeout_scale(self) -> float:
        # The config's settings (accel, images_dir), never the environment's: `vmd serve
        # --config FILE` with accel in the file is obeyed here as by the doctor.
        return timeout_scale(accel(self.config))

    def _adapter(self, machine, image, came: str = "cold", came_note: str | None = None) -> LibvirtMachine:
        return LibvirtMachine(machine, image, desktop_wait_s=self.config.desktop_wait_s, came=came,
                              came_note=came_note, guard=self.guard)

    def os_family(self, os: str) -> str | None:
        try:
            return find_image(os, self.config.images_dir).os_family
        except ImageMissing:
            return None  # the boot says what is missing, in the session's words

    def image_desktop(self, os: str) -> bool | None:
        try:
            return find_image(os, self.config.images_dir).desktop
        except ImageMissing:
            return None

    def _image(self, spec: MachineSpec):
        return find_image(spec.os, self.config.images_dir)

    def create(self, spec: MachineSpec) -> SessionMachine:
        image = self._image(spec)
        host = self._host_of(spec)
        note = None
        if spec.for_check:
            room = self._room(spec, image, host)
            if room is not None:
                return room
        # A session of this image runs here: its finish's rooms wait parked (once a template is made).
        self.parked_rooms[host.name].want(image)
        pool = self.pools.get(host.name)
        if pool is not None:
            machine, note = pool.machine_for(image, workdir=spec.workdir, project_dir=spec.project_dir,
                                             session_id=spec.session_id)
            if machine is not None:
                adapter = self._adapter(machine, image, came="warm")
                # A slot is saved without egress: a session whose egress was approved before its
                # machine came gets it now, as a cold boot would, and only with the guard checked.
                if spec.egress and self.egress_problem() is None:
                    try:
                        adapter.set_egress(True)
                    except Exception as exc:  # the machine stands; its egress stays closed, said in the log
                        log.warning("a warm machine for session %s: egress could not be opened: %s",
                                    spec.session_id, exc)
                return adapter
        machine = Machine.create(image, name=spec.name, workdir=spec.workdir, project_dir=spec.project_dir,
                                 host=host, egress=spec.egress and self.egress_problem() is None,
                                 qemu_user=self.config.share_user, config=self.config,
                                 owner=self._owner(spec))
        return self._adapter(machine, image, came_note=note)

    def _room(self, spec: MachineSpec, image, host: Host) -> SessionMachine | None:
        """A clean room's machine: a parked one (vmd/machines/parked_rooms.py), else restored
        from the host's room templates, or None (it boots cold)."""
        got = None
        try:
            parked = self.parked_rooms[host.name].take(image, workdir=spec.workdir, project_dir=spec.project_dir,
                                                       session_id=spec.session_id)
            if parked is not None:
                machine, release, came = parked
                got = machine, release
        except Exception as exc:  # the folders, libvirt: the room is restored from a template instead
            log.warning("a clean room of session %s could not come parked: %s", spec.session_id, exc)
        if got is None:
            came = "template"
            try:
                got = self.templates[host.name].room(image, workdir=spec.workdir, project_dir=spec.project_dir,
                                                     session_id=spec.session_id)
            except Exception as exc:  # the templates' folder, libvirt: the room boots cold instead
                log.warning("a clean room of session %s could not come from a template: %s", spec.session_id, exc)
                return None
        if got is None:
            return None
        machine, release = got
        adapter = self._adapter(machine, image, came=came)
        if spec.egress and self.egress_problem() is None:  # saved without egress, as a slot is
            try:
                adapter.set_egress(True)
            except Exception as exc:
                log.warning("a clean room of session %s: egress could not be opened: %s", spec.session_id, exc)

        def destroy() -> None:
            try:
                machine.destroy()
            finally:
                release()  # the template serves the next room

        adapter.destroy = destroy
        return adapter

    def _owner(self, spec: MachineSpec):
        return VmdOwner(state_dir=str(self.config.state_dir), session=spec.session_id)

    def attach(self, spec: MachineSpec) -> SessionMachine:
        image = self._image(spec)
        machine = Machine.attach(image, name=spec.name, workdir=spec.workdir, project_dir=spec.project_dir,
                                 host=self._host_of(spec), config=self.config)
        return self._adapter(machine, image)

    def discard(self, spec: MachineSpec) -> bool:
        """Destroys what a create cut short left in libvirt (a domain defined or started
        after the session's close began); True when there was one."""
        return Machine.discard(spec.name, spec.workdir, self._host_of(spec))

    def sweep(self, keep: Callable[[str, str | None], bool]) -> list[str]:
        """Destroys and undefines the guests of this vmd's state dir that no session owns
        any more (`keep(name, session id)` is False): no guest may run without a live or
        pending session. A domain is this vmd's when its <metadata> names this state dir
        exactly (vmd/machines/domain_xml.py `VmdOwner`), so the guests of another vmd on the same
        libvirt are never touched; warm pool slots (no session yet) are the pool's.
        Every host is swept. Returns the names destroyed; libvirt unreachable is no error
        here (the next sweep tries again)."""
        destroyed: list[str] = []
        for uri in dict.fromkeys(h.libvirt_uri for h in self.hosts.values()):  # each libvirt once
            destroyed += self._sweep(uri, keep)
        return destroyed

    def _handing_out(self, name: str) -> bool:
        return any(pool.handing_out(name) for pool in self.pools.values())

    def _sweep(self, uri: str, keep: Callable[[str, str | None], bool]) -> list[str]:
        try:
            conn = libvirt.open(uri)
        except libvirt.libvirtError:
            return []
        destroyed = []
        try:
            for domain in conn.listAllDomains():
                try:
                    name = domain.name()
                    if not name.startswith("vmagent-"):
                        continue
                    session = self._session_of(domain.XMLDesc(0))
                    if session is None or keep(name, session) or self._handing_out(name):
                        continue
                    if domain.isActive():
                        domain.destroy()
                    undefine(domain)  # with a UEFI guest's variable store
                except libvirt.libvirtError:
                    continue
                # A warm machine keeps its slot's name: its files are under its session's id.
                (self.config.sessions_dir / session / "machine" / "overlay.qcow2").unlink(missing_ok=True)
                destroyed.append(name)
        finally:
            conn.close()
        return destroyed

    def _session_of(self, xml: str) -> str | None:
        """The session of this vmd that a domain belongs to, or None when it is not this
        vmd's (or a warm slot no session owns yet). A domain of a vmd older than the
        <metadata> owner is this vmd's when its disk lies in a session folder of this
        state dir (a path under it, compared by parts, never as a substring)."""
        root = ET.fromstring(xml)
        owner = vmd_owner(root)
        if owner is not None:
            if Path(owner.state_dir) != Path(self.config.state_dir) or not owner.session:
                return None
            return owner.session if SESSION_ID.fullmatch(owner.session) else None
        for source in root.iterfind("devices/disk/source"):
            path = Path(source.get("file") or "")
            if path.parent.parent.parent == Path(self.config.sessions_dir) and SESSION_ID.fullmatch(path.parent.parent.name):
                return path.parent.parent.name
        return None
