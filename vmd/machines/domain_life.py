"""One guest's libvirt domain made and unmade (vmd/machines/machine.py drives the guest in it).

Made: a qcow2 overlay on the image's read-only disk, the console log QEMU appends to, the
domain's XML from the image's devices (device_set.py), defined and started. Unmade: the domain
destroyed and undefined, with what vmd made for it (overlay, SMB account, screen folder).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import libvirt

from vmd.config import VmdConfig
from vmd.host_env import clean_env
from vmd.machines.accel import config_accel
from vmd.machines.boot_share import share_for
from vmd.machines.device_set import device_set
from vmd.machines.domain_xml import RunAs, SerialLog, VmdOwner, nic_macs
from vmd.machines.host import DEFAULT_URI, Host
from vmd.machines.images import Image
from vmd.machines.port import MachineError
from vmd.machines.qemu_access import check_reachable, make_screen_dir
from vmd.machines.smb_share import release_share
from vmd.private_fs import open_private, passable_dir, private_file, write_private
from vmd.projects.tree import share_owner


def connect(uri: str = DEFAULT_URI) -> libvirt.virConnect:
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise MachineError(
            f"cannot reach libvirt at {uri} ({exc.get_error_message()}). Start it with "
            "`virtlogd -d; libvirtd -d` (or `systemctl start libvirtd`), or set VMD_LIBVIRT_URI."
        ) from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_domain(image: Image, *, name: str, workdir: Path, project_dir: Path | None, host: Host,
                 egress: bool, qemu_user: str, config: VmdConfig, owner: VmdOwner | None,
                 share: str | None) -> tuple[libvirt.virDomain, int, str]:
    """The domain `name` of `image` defined and started in `workdir` (its overlay, console log
    and domain.xml there), with `project_dir` as its share; returns it, its SSH port and its accelerator.
    MachineError, with `workdir` gone, when libvirt refuses it."""
    base = image.path("disk")
    conn = connect(host.libvirt_uri)
    run_as = share_owner(qemu_user)
    # QEMU passes through to the overlay and console log (which libvirt's DAC relabelling
    # hands to its user while the guest runs); domain.xml and the rest stay vmd's.
    passable_dir(workdir, run_as[1] if run_as else None)
    if run_as is not None and host.libvirt_uri.startswith("qemu"):  # the test driver runs no QEMU
        for place in (workdir, project_dir, base):
            if place is not None:
                check_reachable(Path(place), *run_as, qemu_user)
    make_screen_dir(host, workdir, run_as)
    overlay = workdir / "overlay.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "qcow2",
                    str(overlay)], check=True, capture_output=True, env=clean_env())
    private_file(overlay)  # qemu-img follows the umask; the guest's disk is nobody else's
    os.close(open_private(workdir / "console.log"))  # QEMU appends; libvirt gives it the file
    acc = config_accel(config)
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
                           f"{exc.get_error_message()}{owner_count_hint(exc.get_error_message())}") from None
    return domain, port, acc


def owner_count_hint(message: str) -> str:
    """What to do about libvirt's stale count of a shared file's users: it is kept in
    xattrs until the host reboots, so a QEMU that died outside libvirt fails every later
    start that shares the image's kernel (measured on a CI host: 30 tests lost)."""
    if "which is already in use" not in message:
        return ""
    return (". libvirt remembers the owners of shared files and its count is stale (a guest "
            "ended outside libvirt): set remember_owner = 0 in /etc/libvirt/qemu.conf and "
            "restart libvirtd, as scripts/setup.sh does")


def undefine(domain: libvirt.virDomain) -> None:
    """Undefines `domain` with a UEFI guest's variable store and a TPM's state (a plain
    undefine refuses a domain with an nvram file); libvirt's test driver knows neither flag."""
    try:
        domain.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_TPM)
    except libvirt.libvirtError:
        domain.undefine()


def remove_domain(domain: libvirt.virDomain, workdir: Path, host: Host) -> None:
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
