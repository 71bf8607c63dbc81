"""Stand-ins for Microsoft's CD boot loaders that OVMF really runs: tiny UEFI applications
(PE32+, x86-64, subsystem 10) built here byte by byte, in FAT images as efisys.bin and
efisys_noprompt.bin are (EFI/BOOT/BOOTX64.EFI in a 1.44 MB FAT12 image, written by mtools).

Each prints a line on the console, which OVMF mirrors on COM1 with its own boot lines, then
behaves as the loader it stands for does at that point:
- `prompting`: "Press any key to boot from CD or DVD" and no key came: it returns
  EFI_TIMEOUT to the firmware, which prints that its CD boot option failed with "Time out";
- `booting`: Setup has started (here: the ready marker, so the install's wait ends) and the
  machine powers off through the runtime service ResetSystem(EfiResetShutdown).

The offsets are the UEFI specification's: EFI_SYSTEM_TABLE.ConOut at 0x40 and
RuntimeServices at 0x58, EFI_SIMPLE_TEXT_OUTPUT_PROTOCOL.OutputString at 0x08,
EFI_RUNTIME_SERVICES.ResetSystem at 0x68; the calling convention is Microsoft x64's.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

EFI_TIMEOUT = 0x8000000000000012
TEXT_RVA = 0x1000
FILE_ALIGN = 0x200


def _code(message_offset: int, shutdown: bool) -> bytes:
    """x86-64 code at TEXT_RVA; the UTF-16 message lies `message_offset` bytes into the section."""
    code = bytearray()
    code += b"\x53"                      # push rbx (rsp is then 16-byte aligned)
    code += b"\x48\x83\xec\x20"          # sub rsp, 0x20 (the callee's shadow space)
    code += b"\x48\x89\xd3"              # mov rbx, rdx (SystemTable)
    code += b"\x48\x8b\x4b\x40"          # mov rcx, [rbx+0x40] (ConOut)
    lea_at = len(code)
    code += b"\x48\x8d\x15\0\0\0\0"      # lea rdx, [rip+message]
    code += b"\xff\x51\x08"              # call [rcx+0x08] (OutputString)
    if shutdown:
        code += b"\x48\x8b\x43\x58"      # mov rax, [rbx+0x58] (RuntimeServices)
        code += b"\xb9\x02\0\0\0"        # mov ecx, 2 (EfiResetShutdown)
        code += b"\x31\xd2"              # xor edx, edx (EFI_SUCCESS)
        code += b"\x45\x31\xc0"          # xor r8d, r8d
        code += b"\x45\x31\xc9"          # xor r9d, r9d
        code += b"\xff\x50\x68"          # call [rax+0x68] (ResetSystem; does not return)
    code += b"\x48\xb8" + struct.pack("<Q", EFI_TIMEOUT)  # mov rax, EFI_TIMEOUT
    code += b"\x48\x83\xc4\x20"          # add rsp, 0x20
    code += b"\x5b\xc3"                  # pop rbx; ret
    rel = message_offset - (lea_at + 7)
    code[lea_at + 3:lea_at + 7] = struct.pack("<i", rel)
    return bytes(code)


def efi_application(message: str, shutdown: bool) -> bytes:
    """A PE32+ UEFI application that prints `message` and then shuts down or times out."""
    text = message.encode("utf-16-le") + b"\0\0"
    message_offset = 0x100  # the code is shorter than this
    code = _code(message_offset, shutdown)
    assert len(code) < message_offset
    section = code.ljust(message_offset, b"\xcc") + text
    raw_size = -(-len(section) // FILE_ALIGN) * FILE_ALIGN
    image_size = TEXT_RVA + -(-len(section) // 0x1000) * 0x1000
    dos = b"MZ".ljust(0x3C, b"\0") + struct.pack("<I", 0x40)
    coff = struct.pack("<HHIIIHH", 0x8664, 1, 0, 0, 0, 240, 0x0022)
    optional = struct.pack("<HBBIIIII", 0x20B, 0, 0, raw_size, 0, 0, TEXT_RVA, TEXT_RVA)
    optional += struct.pack("<QIIHHHHHHIIIIHHQQQQII", 0x10000000, 0x1000, FILE_ALIGN, 0, 0, 0, 0, 0, 0, 0,
                            image_size, FILE_ALIGN, 0, 10, 0, 0x100000, 0x1000, 0x100000, 0x1000, 0, 16)
    optional += b"\0" * (16 * 8)  # no data directories: no imports, no relocations needed (RIP-relative code)
    assert len(optional) == 240
    header = struct.pack("<8sIIIIIIHHI", b".text", len(section), TEXT_RVA, raw_size, FILE_ALIGN, 0, 0, 0, 0,
                         0x60000020)
    headers = (dos + b"PE\0\0" + coff + optional + header).ljust(FILE_ALIGN, b"\0")
    return headers + section.ljust(raw_size, b"\0")


def need_mtools() -> None:
    if not shutil.which("mformat"):
        pytest.skip("mtools is not installed (setup.sh installs it)")


def fat_boot_image(work: Path, name: str, application: bytes) -> bytes:
    """A 1.44 MB FAT12 image holding EFI/BOOT/BOOTX64.EFI, as efisys.bin does."""
    need_mtools()
    image, loader = work / f"{name}.img", work / f"{name}.efi"
    loader.write_bytes(application)
    subprocess.run(["mformat", "-i", str(image), "-C", "-f", "1440", "::"], check=True, capture_output=True)
    subprocess.run(["mmd", "-i", str(image), "::/EFI", "::/EFI/BOOT"], check=True, capture_output=True)
    subprocess.run(["mcopy", "-i", str(image), str(loader), "::/EFI/BOOT/BOOTX64.EFI"], check=True,
                   capture_output=True)
    return image.read_bytes()


def prompting_loader(work: Path) -> bytes:
    return fat_boot_image(work, "efisys", efi_application("\r\nPress any key to boot from CD or DVD...\r\n",
                                                          shutdown=False))


def booting_loader(work: Path, line: str) -> bytes:
    return fat_boot_image(work, "efisys_noprompt", efi_application(f"\r\n{line}\r\n", shutdown=True))
