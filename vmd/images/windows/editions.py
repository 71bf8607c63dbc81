"""The editions on a Windows install ISO, read from `sources/install.wim` (or `install.esd`).

A WIM (and an ESD, which is a WIM with solid LZMS resources) starts with a 208-byte header
whose resource header at 0x48 locates the XML metadata; the XML is stored uncompressed in
UTF-16LE (wimlib's include/wimlib/header.h, and `wiminfo --xml` prints the same bytes). So
the editions are read straight out of the ISO with pycdlib, without copying gigabytes of
install.wim to disk. Windows media keep their files in UDF (the ISO 9660 tree holds only a
README), so UDF is tried first, then Joliet, then ISO 9660.
"""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pycdlib
from pycdlib.pycdlibexception import PyCdlibException

from vmd.errors import WordedError

WIM_MAGIC = b"MSWIM\0\0\0"
WIM_HEADER_SIZE = 208
XML_RESHDR_OFFSET = 0x48
# Real install.wim XML is 10-40 KiB per edition; a "header" claiming more than this is not a WIM.
XML_MAX_BYTES = 16 * 1024 * 1024
INSTALL_IMAGES = ("/sources/install.wim", "/sources/install.esd")
# <ARCH> in the WIM XML: PROCESSOR_ARCHITECTURE_* values.
ARCH_NAMES = {"0": "x86", "5": "arm", "6": "ia64", "9": "x64", "12": "arm64"}
SUPPLY_HINT = ("pass the path of a Windows 10/11 or Windows Server x64 install ISO you downloaded "
               "yourself with --iso (vmd never downloads Windows media)")


class MediaError(WordedError, ValueError):
    """The ISO cannot be used; the message says why and what to pass instead."""


@dataclass(frozen=True)
class Edition:
    index: int
    name: str
    description: str
    edition_id: str  # "Professional", "ServerStandard", ...
    arch: str  # "x64", "arm64", "x86", ...
    installation_type: str  # "Client", "Server", "Server Core"
    major: int
    minor: int
    build: int
    languages: tuple[str, ...]

    @property
    def is_server(self) -> bool:
        return self.installation_type.startswith("Server")

    @property
    def is_windows11(self) -> bool:
        # Windows 11 still says 10.0 in its version; build 22000 is where 11 begins.
        return not self.is_server and self.major == 10 and self.build >= 22000

    @property
    def family(self) -> str:
        """The virtio-win folder name for this edition: w10, w11, 2k16, 2k19, 2k22, 2k25."""
        if not self.is_server:
            return "w11" if self.is_windows11 else "w10"
        for build, name in ((26100, "2k25"), (20348, "2k22"), (17763, "2k19")):
            if self.build >= build:
                return name
        return "2k16"

    def line(self) -> str:
        return f"{self.index}: {self.name} ({self.arch}, build {self.build})"


def _text(el: ET.Element | None, path: str, default: str = "") -> str:
    found = el.find(path) if el is not None else None
    return (found.text or "").strip() if found is not None and found.text else default


def _int(el: ET.Element | None, path: str) -> int:
    try:
        return int(_text(el, path, "0"), 0)
    except ValueError:  # a field a tool wrote oddly: the version then reads as unknown (0)
        return 0


def parse_wim_xml(xml: str) -> list[Edition]:
    root = ET.fromstring(xml)
    editions = []
    for image in root.findall("IMAGE"):
        win = image.find("WINDOWS")
        name = _text(image, "NAME") or _text(image, "DISPLAYNAME")
        editions.append(Edition(
            index=int(image.get("INDEX", "0")),
            name=name,
            description=_text(image, "DESCRIPTION") or _text(image, "DISPLAYDESCRIPTION"),
            edition_id=_text(win, "EDITIONID") or _text(image, "FLAGS"),
            arch=ARCH_NAMES.get(_text(win, "ARCH"), f"unknown ({_text(win, 'ARCH') or 'no ARCH'})"),
            installation_type=_text(win, "INSTALLATIONTYPE", "Client"),
            major=_int(win, "VERSION/MAJOR"), minor=_int(win, "VERSION/MINOR"),
            build=_int(win, "VERSION/BUILD"),
            languages=tuple(_text(lang, ".") for lang in (win.findall("LANGUAGES/LANGUAGE") if win is not None else ())),
        ))
    return sorted(editions, key=lambda e: e.index)


def wim_xml(stream, where: str) -> str:
    """The XML metadata of the WIM or ESD readable from `stream` (seekable, at any offset)."""
    stream.seek(0)
    header = stream.read(WIM_HEADER_SIZE)
    if len(header) < WIM_HEADER_SIZE or not header.startswith(WIM_MAGIC):
        raise MediaError(f"{where} is not a Windows image file (no MSWIM header); {SUPPLY_HINT}.")
    size_and_flags, offset, _original = struct.unpack_from("<QQQ", header, XML_RESHDR_OFFSET)
    size = size_and_flags & 0x00FF_FFFF_FFFF_FFFF  # 7 bytes of size, then one byte of flags
    if not 0 < size <= XML_MAX_BYTES:
        raise MediaError(f"{where} has no readable edition list (XML size {size}); {SUPPLY_HINT}.")
    stream.seek(offset)
    data = stream.read(size)
    if len(data) != size:
        raise MediaError(f"{where} ends before its edition list: the file is cut short; {SUPPLY_HINT}.")
    return data.decode("utf-16-le").lstrip("\ufeff")


def _open_install_image(iso: pycdlib.PyCdlib):
    """(file object, ISO path) of the install image, whichever tree the ISO carries it in."""
    for path in INSTALL_IMAGES:
        for kind in ("udf_path", "joliet_path", "iso_path"):
            if kind == "udf_path" and not iso.has_udf():
                continue
            if kind == "joliet_path" and not iso.has_joliet():
                continue
            lookup = path.upper() + ";1" if kind == "iso_path" else path
            try:
                return iso.open_file_from_iso(**{kind: lookup}), path
            except PyCdlibException:
                continue
    return None, None


def read_editions(iso_path: Path) -> list[Edition]:
    if not iso_path.is_file():
        raise MediaError(f"there is no file at {iso_path}; {SUPPLY_HINT}.")
    iso = pycdlib.PyCdlib()
    try:
        iso.open(str(iso_path))
    except (PyCdlibException, OSError) as exc:
        raise MediaError(f"{iso_path} is not a readable ISO image ({exc}); {SUPPLY_HINT}.") from exc
    try:
        stream, inner = _open_install_image(iso)
        if stream is None:
            raise MediaError(f"{iso_path} holds neither sources/install.wim nor sources/install.esd, so it is "
                             f"not Windows install media; {SUPPLY_HINT}.")
        with stream:
            xml = wim_xml(stream, f"{inner} in {iso_path}")
    finally:
        iso.close()
    try:
        editions = parse_wim_xml(xml)
    except ET.ParseError as exc:
        raise MediaError(f"the edition list of {iso_path} is not well-formed XML ({exc}); {SUPPLY_HINT}.") from exc
    if not editions:
        raise MediaError(f"{iso_path} lists no editions in its install image; {SUPPLY_HINT}.")
    return editions


def pick_edition(editions: list[Edition], wanted: str | None) -> Edition:
    """The edition `wanted` names (its index, or its name case-insensitively), else the only
    one or, among several, the first Pro / Standard-with-desktop one; refuses what vmd cannot run."""
    listing = "; ".join(e.line() for e in editions)
    if wanted:
        chosen = next((e for e in editions if wanted.strip() == str(e.index)), None) or next(
            (e for e in editions if wanted.strip().lower() == e.name.lower()), None)
        if chosen is None:
            raise MediaError(f"the ISO has no edition '{wanted}'; pass --edition with one of: {listing}.")
    elif len(editions) == 1:
        chosen = editions[0]
    else:
        preferred = [e for e in editions if e.edition_id in ("Professional", "ServerStandard")
                     and e.installation_type != "Server Core"]
        chosen = (preferred or editions)[0]
    if chosen.arch == "arm64" or chosen.arch == "arm":
        raise MediaError(f"edition {chosen.line()} is for ARM; vmd runs x64 guests on this x86-64 host: use x64 "
                         f"(amd64) install media.")
    if chosen.arch != "x64":
        raise MediaError(f"edition {chosen.line()} is not a 64-bit x64 image; vmd's guests boot with UEFI, which "
                         f"32-bit Windows media cannot: use x64 install media.")
    return chosen
