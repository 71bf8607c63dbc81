"""The accelerator a guest gets (vmd/machines/accel.py, through vmd/machines/machine.py): KVM when QEMU can
really start a KVM guest, TCG otherwise, either forced by the accel setting (VMD_ACCEL).
A fake qemu-system-x86_64 stands in for QEMU; no libvirt and no guest."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmd.machines import accel
from vmd.machines import machine


def no_probe() -> bool:
    raise AssertionError("a forced setting does not ask QEMU")


def fake_qemu(tmp_path: Path, exit_code: int) -> str:
    """A qemu-system-x86_64 that keeps its arguments and stdin and exits with `exit_code`
    (1: what QEMU does when KVM opens but a vCPU cannot be set up)."""
    script = tmp_path / "qemu-system-x86_64"
    script.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/args"\ncat > "{tmp_path}/stdin"\nexit {exit_code}\n')
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("setting, kvm_usable, chosen", [
    ("auto", True, "kvm"),
    ("auto", False, "qemu"),
])
def test_auto_asks_whether_kvm_works(setting, kvm_usable, chosen):
    assert accel.choose_accel(setting, lambda: kvm_usable) == chosen


@pytest.mark.parametrize("setting, chosen", [("kvm", "kvm"), ("qemu", "qemu"), ("tcg", "qemu")])
def test_a_forced_setting_is_taken_without_a_probe(setting, chosen):
    assert accel.choose_accel(setting, no_probe) == chosen


def test_kvm_works_when_qemu_starts_a_kvm_guest(tmp_path):
    device = tmp_path / "kvm"
    device.write_text("")
    assert accel.probe_kvm(device, fake_qemu(tmp_path, 0)) is True
    assert "-accel kvm" in (tmp_path / "args").read_text() and (tmp_path / "stdin").read_text() == "quit\n"


def test_kvm_that_qemu_cannot_use_is_tcg(tmp_path):
    device = tmp_path / "kvm"
    device.write_text("")
    assert accel.probe_kvm(device, fake_qemu(tmp_path, 1)) is False
    assert accel.probe_kvm(device, str(tmp_path / "no-qemu-here")) is False


def test_without_the_device_qemu_is_not_asked(tmp_path):
    qemu = fake_qemu(tmp_path, 0)
    assert accel.probe_kvm(tmp_path / "absent-kvm", qemu) is False
    assert not (tmp_path / "args").exists()


def test_tcg_timeouts_are_four_times_longer():
    assert machine.timeout_scale("kvm") == 1.0 and machine.timeout_scale("qemu") == 4.0


def test_the_machine_follows_the_config_it_is_given_or_the_settings_in_effect(monkeypatch):
    from vmd.config import VmdConfig
    monkeypatch.setattr(accel, "kvm_works", no_probe)
    assert machine.accel(VmdConfig(accel="tcg")) == "qemu" and machine.accel(VmdConfig(accel="kvm")) == "kvm"
    monkeypatch.delenv("VMD_CONFIG", raising=False)
    monkeypatch.setenv("VMD_ACCEL", "qemu")
    assert machine.accel() == "qemu" and machine.timeout_scale() == 4.0
    monkeypatch.setenv("VMD_ACCEL", "KVM")
    assert machine.accel() == "kvm" and machine.timeout_scale() == 1.0


def test_by_default_the_probe_of_this_host_decides(monkeypatch):
    monkeypatch.delenv("VMD_CONFIG", raising=False)
    monkeypatch.delenv("VMD_ACCEL", raising=False)
    monkeypatch.setattr(accel, "kvm_works", lambda images_dir: False)
    assert machine.accel() == "qemu" and machine.timeout_scale() == 4.0
    monkeypatch.setattr(accel, "kvm_works", lambda images_dir: True)
    assert machine.accel() == "kvm" and machine.timeout_scale() == 1.0


def test_the_probe_takes_its_kernel_from_the_images_dir_of_the_config_it_is_given(tmp_path, monkeypatch):
    # vmd's config says images_dir (its file, `vmd serve --config FILE`) and the process's
    # environment says another or none: the probe boots a kernel of the config's folder, the
    # images vmd's guests boot; it read VmdConfig.load() from the environment before.
    from vmd.config import VmdConfig
    from vmd.machines.libvirt_machines import LibvirtMachines

    images = tmp_path / "from-the-file"
    (images / "debian-abc").mkdir(parents=True)
    (images / "debian-abc" / "vmlinuz").write_bytes(b"\0")
    (tmp_path / "vmd.toml").write_text(f'images_dir = "{images}"\naccel = "auto"\n')
    monkeypatch.delenv("VMD_CONFIG", raising=False)
    monkeypatch.delenv("VMD_ACCEL", raising=False)
    monkeypatch.setenv("VMD_IMAGES_DIR", str(tmp_path / "elsewhere"))
    config = VmdConfig.load(tmp_path / "vmd.toml", env={}, state_dir=str(tmp_path / "state"))
    asked = []
    monkeypatch.setattr(accel, "probe_kvm", lambda kernel=None, firmware=None: asked.append(kernel) or True)
    accel.kvm_works.cache_clear()
    try:
        assert machine.accel(config) == "kvm"
        assert LibvirtMachines(config).timeout_scale() == 1.0
        assert asked == [images / "debian-abc" / "vmlinuz"], "asked once, with the file's images' kernel"
    finally:
        accel.kvm_works.cache_clear()


def fake_qemu_booting(tmp_path: Path, banner: bool) -> str:
    """A qemu-system-x86_64 whose paused start works, and whose kernel boot prints the
    kernel's banner (`banner`) or only the real-mode setup's line and then hangs, as KVM
    did on a nested host."""
    script = tmp_path / "qemu-system-x86_64"
    line = "Linux version 6.1.0-fake" if banner else "Probing EDD (edd=off to disable)... ok"
    script.write_text('#!/bin/sh\ncase "$*" in *-kernel*) echo "' + line + '"; exec sleep 60;; esac\n'
                      'cat >/dev/null\nexit 0\n')
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("banner, works", [(True, True), (False, False)])
def test_kvm_that_starts_but_cannot_run_a_kernel_is_tcg(tmp_path, banner, works):
    device = tmp_path / "kvm"
    device.write_text("")
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"\0")
    assert accel.probe_kvm(device, fake_qemu_booting(tmp_path, banner), kernel=kernel) is works


def test_the_probe_kernel_is_a_built_images_first(tmp_path):
    (tmp_path / "images" / "debian-abc").mkdir(parents=True)
    (tmp_path / "boot").mkdir()
    assert accel.probe_kernel(tmp_path / "images", tmp_path / "boot") is None
    (tmp_path / "boot" / "vmlinuz-6.1").write_bytes(b"\0")
    assert accel.probe_kernel(tmp_path / "images", tmp_path / "boot") == tmp_path / "boot" / "vmlinuz-6.1"
    (tmp_path / "images" / "debian-abc" / "vmlinuz").write_bytes(b"\0")
    assert accel.probe_kernel(tmp_path / "images", tmp_path / "boot") == tmp_path / "images" / "debian-abc" / "vmlinuz"


def fake_firmware_qemu(tmp_path: Path, serial: str) -> str:
    """A qemu-system-x86_64 that starts (the -S probe), and booted with pflash drives writes
    `serial` to its serial console, as OVMF's boot manager does, then runs on."""
    script = tmp_path / "qemu-system-x86_64"
    script.write_text(f'#!/bin/sh\ncase "$*" in *if=pflash*) echo "$@" > "{tmp_path}/boot-args"; '
                      f'printf "{serial}"; exec sleep 30;; esac\ncat >/dev/null\nexit 0\n')
    script.chmod(0o755)
    return str(script)


def test_without_a_kernel_the_firmware_is_booted_under_kvm(tmp_path):
    # A host with no kernel to boot (a Windows-only host, an empty images folder, /boot not
    # readable): QEMU starting with -accel kvm is not enough on a nested host.
    device = tmp_path / "kvm"
    device.write_text("")
    code, template = tmp_path / "CODE.fd", tmp_path / "VARS.fd"
    code.write_bytes(b"c"), template.write_bytes(b"v")
    assert accel.probe_kvm(device, fake_firmware_qemu(tmp_path, "BdsDxe: loading Boot0001\\n"),
                           firmware=(code, template)) is True
    args = (tmp_path / "boot-args").read_text()
    assert "-accel kvm" in args and f"file={code}" in args and "readonly=on" in args
    assert f"file={template}" not in args  # the firmware writes a copy, never the template
    assert accel.probe_kvm(device, fake_firmware_qemu(tmp_path, ""), firmware=(code, template)) is False
    assert accel.probe_firmware(tmp_path / "absent.fd", template) is None


def test_the_firmware_probe_answers_as_the_kernel_probe_on_this_host():
    # Both boot a real guest under KVM with the real QEMU: on a host where KVM runs guests both
    # say so, and on a nested host where it starts and hangs them (this project's CI machines)
    # both say no, where QEMU's start alone said yes.
    from vmd.config import VmdConfig

    kernel = accel.probe_kernel(VmdConfig.load().images_dir)  # the Debian image's, as vmd's probe takes
    firmware = accel.probe_firmware()
    if kernel is None or firmware is None or not accel.KVM_DEVICE.exists():
        pytest.skip("needs /dev/kvm, a kernel and OVMF (setup.sh installs them)")
    assert accel.probe_kvm(firmware=firmware) == accel.probe_kvm(kernel=kernel)
