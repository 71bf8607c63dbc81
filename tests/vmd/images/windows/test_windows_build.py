"""`vmd images build windows` (vmd/images/windows/build.py): refused before anything slow on
a host without KVM (this one), and the whole pipeline with only the install boot itself
replaced: real editions, answer file, seed, qemu-img disk and compression, manifest."""

from __future__ import annotations

import hashlib
import io
import json
import re
import stat
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pycdlib
import pytest

from tests.conftest import make_traversable
from tests.support.windows_media import make_windows_iso
from vmd.guests.windows import contract
from vmd.images.windows.build import WindowsBuildOptions, build_windows
from vmd.images.windows.install import InstallFailed, host_problems, serial_says
from vmd.images.windows.readiness import windows_readiness
from vmd.machines.accel import kvm_works
from vmd.machines.images import find_image
from vmd.server import cli


def test_without_kvm_the_build_refuses_before_hashing_the_iso(tmp_path):
    out = io.StringIO()
    with pytest.raises(InstallFailed, match="no working KVM.*takes hours"):
        build_windows(WindowsBuildOptions(iso=make_windows_iso(tmp_path)), tmp_path / "images", out,
                      kvm_usable=lambda: False)
    assert out.getvalue().splitlines()[:3] == [
        f"STEP 1/8 read the editions on {tmp_path / 'win.iso'}", "  2: Windows 11 Pro (x64, build 22631)",
        "STEP 2/8 check this host can run Windows Setup (KVM, OVMF, swtpm)"]
    assert not (tmp_path / "images").exists()


def test_an_iso_qemu_cannot_reach_is_refused_before_the_install(tmp_path):
    iso = make_windows_iso(tmp_path)
    make_traversable(tmp_path)
    tmp_path.chmod(0o700)
    with pytest.raises(InstallFailed, match=f"cannot pass through {tmp_path} to reach {iso}"):
        build_windows(WindowsBuildOptions(iso=iso), tmp_path / "images", io.StringIO(), kvm_usable=lambda: True)


def test_the_cli_refuses_without_an_iso_and_says_vmd_downloads_none(capsys):
    assert cli.main(["images", "build", "windows"]) == 2
    assert "vmd never downloads Windows media" in capsys.readouterr().err
    assert cli.main(["images", "build", "debian", "--iso", "x.iso"]) == 2
    assert "--iso belong to `vmd images build windows`" in capsys.readouterr().err


def test_the_cli_checks_the_options_and_names_the_host_s_problem(tmp_path, capsys):
    iso = make_windows_iso(tmp_path)
    assert cli.main(["images", "build", "windows", "--iso", str(iso), "--key", "ABC", "--resolution", "big"]) == 2
    err = capsys.readouterr().err
    assert "five groups of five" in err and "WIDTHxHEIGHT" in err
    # Asked as the CLI asks (accel.kvm_works: a kernel, else OVMF, booted under KVM): a nested
    # host here opens /dev/kvm and starts QEMU with it, and still hangs every guest, so vmd and
    # the build run without KVM.
    if kvm_works(tmp_path / "img"):
        pytest.skip("this host has KVM: the CLI would start a real install of the test's ISO")
    if host_problems(lambda: True):
        pytest.skip("ovmf, swtpm or qemu-img missing here (setup.sh installs them)")
    code = cli.main(["images", "build", "windows", "--iso", str(iso), "--images-dir", str(tmp_path / "img")])
    # This host has no working KVM: refused with the sentence, exit 1.
    captured = capsys.readouterr()
    assert code == 1 and "no working KVM" in captured.err and "STEP 2/8" in captured.out


def fake_install(seen: dict):
    """Stands in for run_install, the one step that needs KVM: it checks the domain it was
    given and writes what firstlogon.ps1 writes on COM1."""

    def install(domain_xml: str, serial_log: Path, uri: str, out, press_keys: bool, ssh_check) -> None:
        seen["xml"] = ET.fromstring(domain_xml)
        seen["uri"] = uri
        seen["press_keys"] = press_keys
        seen["ssh_check"] = ssh_check
        serial_log.write_text("vmd: OpenSSH Server\r\nvmd: done\r\n" + contract.READY_MARKER + "\r\n")
        assert serial_says(serial_log, contract.READY_MARKER) == contract.READY_MARKER

    return install


def test_the_pipeline_leaves_an_image_vmd_can_find(tmp_path):
    if host_problems(lambda: True):
        pytest.skip("ovmf, swtpm or qemu-img missing here (setup.sh installs them)")
    make_traversable(tmp_path)  # QEMU, another user, must reach the ISO and the build folder
    iso = make_windows_iso(tmp_path, bootable=True)
    root, seen, out = tmp_path / "images", {}, io.StringIO()
    options = WindowsBuildOptions(iso=iso, key="VK7JG-NPHTM-C97JM-9MPGT-3V66T", resolution="1920x1080")
    folder = build_windows(options, root, out, uri="test:///default", kvm_usable=lambda: True,
                           install=fake_install(seen))
    steps = [line.split(" ", 2)[1] for line in out.getvalue().splitlines() if line.startswith("STEP ")]
    assert steps == [f"{n}/8" for n in range(1, 9)]
    assert "  product key: yours (--key)" in out.getvalue().splitlines()

    dom = seen["xml"]
    assert dom.get("type") == "kvm" and dom.find("os/type").get("machine") == "q35"
    assert dom.find("os/loader").text.endswith("OVMF_CODE_4M.fd") and dom.find("devices/tpm").get("model") == "tpm-crb"
    cds = [(d.find("source").get("file"), d.find("driver").get("type"))
           for d in dom.iterfind("devices/disk[@device='cdrom']")]
    # The install CD is the layer over the ISO that boots without a key (boot_medium.py).
    assert cds[0] == (str(folder.with_name(folder.name + ".partial") / "install-noprompt.qcow2"), "qcow2")
    assert cds[1][0].endswith("seed.iso") and not seen["press_keys"]
    # The guest's sshd is forwarded to a loopback port, where the build logs in once it is ready.
    args = [a.get("value") for a in dom.find("{http://libvirt.org/schemas/domain/qemu/1.0}commandline")]
    assert re.fullmatch(r"user,id=vmdnet0,hostfwd=tcp:127\.0\.0\.1:\d+-:22", args[args.index("-netdev") + 1])
    assert callable(seen["ssh_check"])
    assert "  install CD: it boots efi/microsoft/boot/efisys_noprompt.bin, no key to press" in out.getvalue()
    assert dom.find("devices/serial").get("type") == "file"
    assert dom.find("devices/disk[@device='disk']/target").get("bus") == "sata"  # no virtio-win given
    assert stat.S_IMODE(folder.stat().st_mode) == 0o711  # QEMU passes through to the seed; nobody lists

    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["os_family"] == "windows" and manifest["edition"] == "Windows 11 Pro"
    assert manifest["build"] == 22631 and manifest["resolution"] == [1920, 1080]
    assert manifest["iso_sha256"] == hashlib.sha256(iso.read_bytes()).hexdigest()
    assert (manifest["boot"], manifest["uefi"], manifest["tpm"], manifest["share"]) == ("disk", True, True, "smb")
    # No virtio-win: the sessions' guests get the devices Windows drives itself, as the install had.
    assert (manifest["disk_bus"], manifest["nic"]) == ("sata", "e1000e")
    assert folder.name == f"windows-{manifest['recipe']}"
    password = folder / manifest["admin_password_file"]
    assert stat.S_IMODE(password.stat().st_mode) == 0o600 and len(password.read_text().strip()) >= 24
    assert not any((folder / name).exists() for name in ("seed.iso", "install.qcow2", "install-noprompt.qcow2"))
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(folder / "disk.qcow2")],
                                     capture_output=True, check=True, text=True).stdout)
    assert info["format"] == "qcow2" and stat.S_IMODE((folder / "disk.qcow2").stat().st_mode) == 0o444

    image = find_image("windows", root)
    assert (image.os_family, image.user, image.project_path) == ("windows", "agent", "Z:\\")
    again = io.StringIO()
    assert build_windows(options, root, again, kvm_usable=lambda: True, install=fake_install({})) == folder
    assert "up to date" in again.getvalue()
    assert windows_readiness(root, lambda: True)[0] == "ok" and folder.name in windows_readiness(root, lambda: True)[1]


def test_the_seed_the_install_boots_holds_the_password_and_the_edition(tmp_path):
    if host_problems(lambda: True):
        pytest.skip("ovmf, swtpm or qemu-img missing here (setup.sh installs them)")
    make_traversable(tmp_path)
    seen: dict = {}

    def install(domain_xml, serial_log, uri, out, press_keys, ssh_check):
        seen["press_keys"] = press_keys  # this ISO has no El Torito entry: the keys are pressed
        seed = ET.fromstring(domain_xml).findall("devices/disk[@device='cdrom']")[1].find("source").get("file")
        iso = pycdlib.PyCdlib()
        iso.open(seed)
        data = io.BytesIO()
        iso.get_file_from_iso_fp(data, joliet_path="/Autounattend.xml")
        iso.close()
        seen["answer"] = data.getvalue().decode()

    folder = build_windows(WindowsBuildOptions(iso=make_windows_iso(tmp_path), edition="1"), tmp_path / "img",
                           io.StringIO(), kvm_usable=lambda: True, install=install)
    password = (folder / "admin-password").read_text().strip()
    assert f"<Value>{password}</Value>" in seen["answer"] and seen["press_keys"]
    assert "<Key>/IMAGE/INDEX</Key>" in seen["answer"] and "<Value>1</Value>" in seen["answer"]


def test_the_recipe_hash_follows_the_iso_the_options_the_devices_and_the_guest_s_files(tmp_path, monkeypatch):
    from dataclasses import replace

    from vmd.images.windows import build
    from vmd.images.windows.editions import Edition

    pro = Edition(2, "Windows 11 Pro", "", "Professional", "x64", "Client", 10, 0, 22631, ("en-US",))
    options = WindowsBuildOptions(iso=tmp_path / "w.iso")
    first = build.recipe_hash(options, "a" * 64, pro, "en-US")
    assert first == build.recipe_hash(options, "a" * 64, pro, "en-US")
    changed = {build.recipe_hash(options, "b" * 64, pro, "en-US"),
               build.recipe_hash(options, "a" * 64, replace(pro, index=1), "en-US"),
               build.recipe_hash(options, "a" * 64, pro, "de-DE"),
               build.recipe_hash(WindowsBuildOptions(iso=options.iso, key="VK7JG-NPHTM-C97JM-9MPGT-3V66T"),
                                 "a" * 64, pro, "en-US"),
               build.recipe_hash(WindowsBuildOptions(iso=options.iso, resolution="1920x1080"), "a" * 64, pro, "en-US")}
    assert first not in changed and len(changed) == 5
    copy = tmp_path / "recipe"
    copy.mkdir()
    for name in build.RECIPE_FILES:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes((build.VMD_DIR / name).read_bytes())
    monkeypatch.setattr(build, "VMD_DIR", copy)
    assert build.recipe_hash(options, "a" * 64, pro, "en-US") == first
    script = copy / "images" / "windows" / "firstlogon.ps1"
    script.write_text(script.read_text() + "\n# changed\n")
    edited = build.recipe_hash(options, "a" * 64, pro, "en-US")
    assert edited != first
    # The machine Windows is installed on (its devices are every session machine's) is part
    # of the recipe: another device set is another image.
    monkeypatch.setattr(build, "device_set_xml", lambda image: "<domain>another machine</domain>")
    assert build.recipe_hash(options, "a" * 64, pro, "en-US") not in (first, edited)


def test_readiness_warns_without_kvm_and_says_how_to_build(tmp_path):
    status, text = windows_readiness(tmp_path, lambda: False)
    assert status == "warn" and "no working KVM" in text
    if not host_problems(lambda: True):
        status, text = windows_readiness(tmp_path, lambda: True)
        assert status == "ok" and "vmd images build windows --iso" in text


def test_the_serial_log_tells_ready_from_failed(tmp_path):
    log = tmp_path / "serial.log"
    assert serial_says(log, "VMD-READY") is None
    log.write_text("vmd: OpenSSH Server\r\nvmd: firstlogon failed: icacls failed\r\n")
    assert serial_says(log, "VMD-READY") == "vmd: firstlogon failed: icacls failed"
    log.write_text("vmd: done\r\nVMD-READY\r\n")
    assert serial_says(log, "VMD-READY") == "VMD-READY"
