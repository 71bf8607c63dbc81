"""A host: where guests run, as vmd reaches it. Its name (kept in a session's state), its
libvirt URI, the address vmd reaches a guest's forwarded SSH port at (the port itself is
per guest), where QEMU's screen dumps land, and its room for guests (`Room`).

Everything that differs between two hosts is read from a `Host`, never from a module
constant, so a second host is a second `Host` value given to the factory
(vmd/machines/libvirt_machines.py `LibvirtMachines`, one warm pool per host). Only the
local host exists today (`local_host`, from `VmdConfig.libvirt_uri`); docs/architecture.md
"A second host" says what a remote one still needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from vmd.machines.host_room import LocalRoom

LOCAL = "local"  # the local host's name; a session.json without a host ran here
DEFAULT_URI = "qemu:///system"
# QEMU's user-mode forward listens on the host's loopback (vmd/machines/domain_xml.py
# UserNetwork): a guest's SSH is reached there, from vmd on the same machine.
LOOPBACK = "127.0.0.1"


class Room(Protocol):
    """How much room a host has for guests (vmd/machines/host_room.py `LocalRoom` measures
    this machine)."""

    def pool_size(self, guest_mib: int) -> int: ...  # warm slots "auto" means here
    def no_room(self, folder: Path, guest_mib: int) -> str | None: ...  # why no slot may be made now


@dataclass(frozen=True)
class Host:
    name: str
    libvirt_uri: str
    # Where vmd connects to a guest's forwarded SSH port on this host.
    ssh_address: str = LOOPBACK
    # QEMU writes screen dumps to a file on its own machine; vmd reads them back only when
    # that machine is vmd's. False: screenshots come over libvirt's stream
    # (vmd/machines/screen.py, 48 ms against 11 ms), which works over any connection.
    local_files: bool = True
    room: Room = field(default_factory=LocalRoom)

    def screen_dir(self, workdir: Path) -> Path | None:
        """The folder QEMU may write a guest's frames to (`workdir` is the guest's folder),
        or None when vmd cannot read what QEMU writes there."""
        return workdir / "screen" if self.local_files else None

    def screen_dump(self, workdir: Path) -> Path | None:
        folder = self.screen_dir(workdir)
        return folder / "frame.ppm" if folder is not None else None


def local_host(libvirt_uri: str = DEFAULT_URI) -> Host:
    """This machine as a host: libvirt at `libvirt_uri` (VmdConfig.libvirt_uri), guests'
    SSH on its loopback, screen dumps in the session's folder, its room read from /proc."""
    return Host(name=LOCAL, libvirt_uri=libvirt_uri, ssh_address=LOOPBACK, local_files=True, room=LocalRoom())
