"""The machine port: what a session needs of a machine (`SessionMachine`), how one is
made (`MachineFactory`, from a `MachineSpec`), what its `ready` tells (`Facts`), how it
fails (`MachineError`, `DesktopMissing`) and why QEMU paused one (`Stall`). The default
factory drives libvirt (vmd/machines/libvirt_machines.py); tests hand a session another
(tests/support/vmd_fakes.py). This module declares; the implementations import it.

A machine is three things: its `guest` (shell and files, and the verbs whose command
differs by OS: vmd/guests/guest.py `Guest`, one class per OS), its `screen` (screenshots and
input: vmd/machines/screen.py `Screen`) and its life cycle (the methods below). The verb handlers
call the guest and the screen directly and make their results from what those return.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from vmd.contract.results import Facts  # part of the contract: the agent reads it (session_ready)
from vmd.errors import WordedError
from vmd.machines.host import Host

if TYPE_CHECKING:  # lazily: a session over another factory never imports paramiko or libvirt
    from vmd.guests.guest import Guest
    from vmd.machines.screen import Screen


class MachineError(WordedError, RuntimeError):
    """The machine could not be created, reached or destroyed; the message says what to do."""


class DesktopMissing(MachineError):
    """The guest answers over SSH, but its desktop did not come up in time."""


@dataclass
class MachineSpec:
    session_id: str
    os: str
    name: str  # the libvirt domain name
    workdir: Path
    project_dir: Path | None
    egress: bool = False
    # Where the guest runs (vmd/machines/host.py): the session's `MachineFactory.host(name)`
    # for the name its state keeps. None: the factory's first host (a spec made by hand).
    host: Host | None = None
    # A clean room's machine (vmd/session/clean_room.py), for one check: restored from the
    # host's room template when it has one (vmd/machines/room_templates.py), never a warm
    # slot, which is a session's.
    for_check: bool = False


@dataclass
class Stall:
    """QEMU paused the guest on its own because a write to its disk failed on the host."""
    no_space: bool  # the host's disk is full (else another I/O error)
    disks: list[str]  # the guest's disks that failed, e.g. ["vda"]

    def sentence(self) -> str:
        disks = ", ".join(self.disks) or "its disk"
        if self.no_space:
            return (f"the host's disk is full: the guest's disk ({disks}) could not grow on the host, "
                    "and QEMU paused the guest")
        return f"the guest's disk ({disks}) failed on the host with an I/O error, and QEMU paused the guest"


class SessionMachine(Protocol):
    """What a session needs of a machine; the only door to the guest."""

    guest: Guest
    screen: Screen
    os_family: str
    project_path: str
    name: str  # its domain's name (a warm machine keeps its slot's)
    came: str  # "warm" (restored from the pool) or "cold" (booted)
    came_note: str | None  # why a machine that could have come warm came cold

    def ready(self, timeout: float, desktop: bool = False) -> dict: ...  # the facts (`Facts` above)
    def reboot(self, timeout: float) -> float: ...  # seconds until it answered again
    def suspend(self) -> None: ...
    def resume(self) -> None: ...
    def destroy(self) -> None: ...
    def alive(self) -> bool: ...
    def stalled(self) -> Stall | None: ...  # paused by QEMU on a host I/O error
    def set_egress(self, open_: bool) -> None: ...
    # The open egress NIC's link down (True) or up again: instant, the NIC stays plugged.
    def cut_egress(self, cut: bool) -> None: ...


class MachineFactory(Protocol):
    # The host of that name (SessionState.host), or where a new session goes when None;
    # MachineError with what to do when this vmd has no such host.
    def host(self, name: str | None = None) -> Host: ...
    def create(self, spec: MachineSpec) -> SessionMachine: ...
    def attach(self, spec: MachineSpec) -> SessionMachine: ...
    # None when a machine's egress may be opened; else the sentence that says what is
    # missing (vmd/machines/egress_guard.py). Egress is never opened unguarded.
    def egress_problem(self) -> str | None: ...
    # Whether the guard in force is this configuration's, without putting it back.
    def guard_problem(self) -> str | None: ...
    # The family of the guest an `os` boots (its image manifest's os_family: "linux",
    # "windows"), which picks its Guest class; None when there is no such image yet.
    def os_family(self, os: str) -> str | None: ...
    # Whether that image's guests have a desktop (its manifest's `desktop`), so the agent's
    # fixed prompt holds the screen tools from the start or never; None: no such image yet.
    def image_desktop(self, os: str) -> bool | None: ...
    def timeout_scale(self) -> float: ...  # how much longer than on KVM its guests take
    # Destroys what a create cut short left behind for `spec`; True when there was something.
    def discard(self, spec: MachineSpec) -> bool: ...
    # Destroys the guests of this vmd that no session owns (`keep(name, session id)` False);
    # the names destroyed.
    def sweep(self, keep: Callable[[str, str | None], bool]) -> list[str]: ...
    # vmd's start and stop: the egress guard in place, the warm pool started and stopped.
    def install_guard(self) -> None: ...
    def start_pool(self) -> None: ...
    def stop_pool(self) -> None: ...
