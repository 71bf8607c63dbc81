"""The editions of a Windows install ISO (vmd/images/windows/editions.py), read from a real
WIM that wimlib's wimcapture made, inside an ISO laid out as Microsoft's are (UDF)."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.windows_media import make_iso, make_wim, make_windows_iso
from vmd.images.windows.editions import MediaError, parse_wim_xml, pick_edition, read_editions


def test_the_editions_come_out_of_install_wim_inside_the_iso(tmp_path):
    editions = read_editions(make_windows_iso(tmp_path))
    assert [(e.index, e.name, e.edition_id, e.arch, e.build) for e in editions] == [
        (1, "Windows 11 Home", "Core", "x64", 22631), (2, "Windows 11 Pro", "Professional", "x64", 22631)]
    assert all(e.is_windows11 and e.family == "w11" and e.languages == ("en-US",) for e in editions)


def test_the_reader_agrees_with_wiminfo(tmp_path):
    wim = make_wim(tmp_path)
    xml = subprocess.run(["wiminfo", "--xml", str(wim)], capture_output=True, check=True).stdout
    from_wiminfo = parse_wim_xml(xml.decode("utf-16-le").lstrip("\ufeff"))
    iso = make_iso(tmp_path / "w.iso", {"sources/install.wim": wim.read_bytes()})
    assert read_editions(iso) == from_wiminfo


def test_an_esd_with_solid_resources_is_read_as_well(tmp_path):
    editions = read_editions(make_windows_iso(tmp_path, esd=True))
    assert [e.name for e in editions] == ["Windows 11 Home", "Windows 11 Pro"]


def test_the_edition_is_picked_by_name_or_index_and_pro_by_default(tmp_path):
    editions = read_editions(make_windows_iso(tmp_path))
    assert pick_edition(editions, None).name == "Windows 11 Pro"
    assert pick_edition(editions, "1").name == "Windows 11 Home"
    assert pick_edition(editions, "windows 11 home").index == 1
    with pytest.raises(MediaError, match=r"no edition 'Education'.*1: Windows 11 Home \(x64, build 22631\)"):
        pick_edition(editions, "Education")


@pytest.mark.parametrize("arch,words", [("12", "is for ARM"), ("0", "not a 64-bit x64 image")])
def test_arm64_and_32_bit_media_are_refused_with_a_sentence(tmp_path, arch, words):
    iso = make_windows_iso(tmp_path, editions=(("Windows 11 Pro", "", "Professional", arch, "Client", "22631"),))
    with pytest.raises(MediaError, match=words):
        pick_edition(read_editions(iso), None)


def test_a_server_iso_is_known_by_its_build(tmp_path):
    iso = make_windows_iso(tmp_path, editions=(
        ("Windows Server 2022 SERVERSTANDARDCORE", "", "ServerStandard", "9", "Server Core", "20348"),
        ("Windows Server 2022 SERVERSTANDARD", "", "ServerStandard", "9", "Server", "20348")))
    chosen = pick_edition(read_editions(iso), None)
    assert (chosen.index, chosen.is_server, chosen.is_windows11, chosen.family) == (2, True, False, "2k22")


def test_missing_or_wrong_media_say_what_to_pass(tmp_path):
    with pytest.raises(MediaError, match="no file at .*vmd never downloads Windows media"):
        read_editions(tmp_path / "absent.iso")
    (tmp_path / "junk.iso").write_bytes(b"not an iso" * 100)
    with pytest.raises(MediaError, match="not a readable ISO image.*--iso"):
        read_editions(tmp_path / "junk.iso")
    linux = make_iso(tmp_path / "linux.iso", {"boot/vmlinuz": b"kernel"})
    with pytest.raises(MediaError, match="neither sources/install.wim nor sources/install.esd"):
        read_editions(linux)
    fake = make_iso(tmp_path / "fake.iso", {"sources/install.wim": b"PK\3\4 a zip, not a WIM" * 20})
    with pytest.raises(MediaError, match="no MSWIM header"):
        read_editions(fake)
