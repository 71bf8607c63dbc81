"""What the install's serial log says (vmd/images/windows/install_watch.py), read from lines
OVMF 2022.11 (Debian 12) printed on COM1 here, booting media laid out like Microsoft's under
QEMU 7.2 (tests/vmd/images/windows/test_windows_install_vm.py boots them), and from firstlogon.ps1's form."""

from __future__ import annotations

from vmd.images.windows.install_watch import cd_started, firmware_problem, guest_steps, stopped_in

CLEAR = "\x1b[2J\x1b[01;01H\x1b[=3h\x1b[2J\x1b[01;01H"
DVD = '"UEFI QEMU DVD-ROM QM00003 " from PciRoot(0x0)/Pci(0x1F,0x2)/Sata(0x1,0xFFFF,0x0)'
DISK = '"UEFI QEMU HARDDISK QM00001 " from PciRoot(0x0)/Pci(0x1F,0x2)/Sata(0x0,0xFFFF,0x0)'
FIRMWARE_TO_CD = (f"{CLEAR}BdsDxe: loading Boot0001 {DISK}\r\nBdsDxe: failed to start Boot0001 {DISK}: Not Found\r\n"
                  f"BdsDxe: loading Boot0002 {DVD}\r\nBdsDxe: starting Boot0002 {DVD}\r\n")
MISSED = ("Press any key to boot from CD or DVD...\r\n"
          f"BdsDxe: failed to start Boot0002 {DVD}: Time out\r\n"
          'BdsDxe: loading Boot0003 "EFI Internal Shell" from Fv(7CB8BDC9-F8EB-4F34-AAEA-3EE4AF6516A1)/'
          "FvFile(7C04A583-9E3E-4F1C-AD65-E05268D0B4D1)\r\n\x1b[2J\x1b[01;01H\x1b[01;01HUEFI Interactive Shell v2.2\r\n")


def test_an_empty_disk_passed_over_is_no_problem_and_the_cd_is_seen_starting():
    assert firmware_problem(FIRMWARE_TO_CD) is None
    assert cd_started(FIRMWARE_TO_CD)
    assert stopped_in(FIRMWARE_TO_CD).startswith("Windows Setup from the install CD")


def test_a_missed_prompt_is_a_time_out_before_it_is_a_shell():
    assert firmware_problem(FIRMWARE_TO_CD + MISSED) == "timeout"
    assert firmware_problem(MISSED.split("BdsDxe: failed")[0] + "UEFI Interactive Shell v2.2\r\n") == "nothing"


def test_a_cd_that_cannot_start_says_why():
    text = FIRMWARE_TO_CD + f"BdsDxe: failed to start Boot0002 {DVD}: Not Found\r\n"
    assert firmware_problem(text) == "cd: Not Found"


def test_where_the_install_stopped_follows_the_log():
    assert stopped_in("") == "the firmware (nothing on COM1 yet)"
    assert stopped_in(f"{CLEAR}BdsDxe: loading Boot0001 {DISK}\r\n").startswith("the firmware (it has not started")
    rebooted = FIRMWARE_TO_CD + 'BdsDxe: starting Boot0004 "Windows Boot Manager" from HD(1,GPT,...)/\\EFI\\Microsoft\r\n'
    assert stopped_in(rebooted).startswith("Windows Setup after its first reboot")
    logon = rebooted + "vmd: running as an administrator\r\nvmd: OpenSSH Server\r\nvmd: firstlogon failed: x\r\n"
    assert stopped_in(logon) == "the first logon, step 'OpenSSH Server' (firstlogon.ps1)"
    assert guest_steps(logon) == ["running as an administrator", "OpenSSH Server", "firstlogon failed: x"]
