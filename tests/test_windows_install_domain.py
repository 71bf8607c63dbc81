"""The install domain's XML (vmd/windows_image/install_domain.py) is valid for libvirt: defined
with schema validation on libvirt's test:///default driver, which checks it against the
domain.rng that libvirtd itself uses."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from vmd.windows_image.install_domain import InstallDomain, SystemDisk, install_firmware

libvirt = pytest.importorskip("libvirt")


def domain(tpm: bool, virtio: bool) -> InstallDomain:
    return InstallDomain(f"vmd-windows-build-{int(tpm)}{int(virtio)}", install_firmware("/images/w.partial/OVMF_VARS.fd", tpm),
                         SystemDisk("/images/w.partial/install.qcow2", virtio), "/media/Win11.iso",
                         "/images/w.partial/seed.iso", "/images/w.partial/serial.log", virtio, run_as=(64055, 64055))


@pytest.mark.parametrize("tpm,virtio", [(True, True), (True, False), (False, False)])
def test_libvirt_accepts_the_install_domain(tpm, virtio):
    conn = libvirt.open("test:///default")
    try:
        defined = conn.defineXMLFlags(domain(tpm, virtio).to_xml(), libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
        back = ET.fromstring(defined.XMLDesc(0))
    finally:
        conn.close()
    assert back.find("os/loader").get("type") == "pflash" and back.find("os/nvram") is not None
    assert (back.find("devices/tpm") is not None) == tpm
    assert back.find("devices/disk[@device='disk']/target").get("bus") == ("virtio" if virtio else "sata")
    assert back.find("devices/interface/model").get("type") == ("virtio" if virtio else "e1000e")
    orders = {d.find("source").get("file"): d.find("boot").get("order")
              for d in back.iterfind("devices/disk") if d.find("boot") is not None}
    assert orders == {"/media/Win11.iso": "1", "/images/w.partial/install.qcow2": "2"}  # CD first while the disk is empty
    assert back.find("devices/serial/source").get("path").endswith("serial.log")


def test_the_schema_check_is_real():
    broken = domain(True, True).to_xml().replace("<readonly />", "<readonly /><no-such-element />", 1)
    conn = libvirt.open("test:///default")
    try:
        with pytest.raises(libvirt.libvirtError, match="failed to validate against schema"):
            conn.defineXMLFlags(broken, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
    finally:
        conn.close()
