"""Autounattend.xml (vmd/windows_image/answer_file.py): the golden file for a Windows 11 Pro
install, and what changes for a server edition, a missing key or another language."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from vmd.windows_image import guest_contract as contract
from vmd.windows_image.answer_file import UNATTEND_NS, AdminAccount, AnswerFile, FirstLogon, Language, UserData
from vmd.windows_image.editions import Edition

GOLDEN = Path(__file__).parent / "golden" / "autounattend_win11_pro.xml"
FIRSTLOGON = Path(__file__).resolve().parents[1] / "vmd" / "windows_image" / "firstlogon.ps1"
NS = {"u": UNATTEND_NS}
WIN11_PRO = Edition(6, "Windows 11 Pro", "Windows 11 Pro", "Professional", "x64", "Client", 10, 0, 22631, ("en-US",))
SERVER_2022 = Edition(2, "Windows Server 2022 SERVERSTANDARD", "", "ServerStandard", "x64", "Server", 10, 0, 20348,
                      ("en-US",))


def answer(edition=WIN11_PRO, key=None, language="en-US") -> ET.Element:
    return ET.fromstring(AnswerFile(edition, Language(language), AdminAccount("Golden-Password-1"),
                                    FirstLogon(1280, 800), UserData(key)).to_xml())


def test_the_windows_11_pro_answer_file_matches_its_golden_file():
    xml = AnswerFile(WIN11_PRO, Language("en-US"), AdminAccount("Golden-Password-1"), FirstLogon(1280, 800),
                     UserData("VK7JG-NPHTM-C97JM-9MPGT-3V66T")).to_xml()
    assert xml == GOLDEN.read_text()


def _pass(root: ET.Element, name: str) -> ET.Element:
    return root.find(f"u:settings[@pass='{name}']", NS)


def test_the_disk_is_gpt_for_uefi_and_windows_goes_on_the_third_partition():
    setup = _pass(answer(), "windowsPE").find("u:component[@name='Microsoft-Windows-Setup']", NS)
    kinds = [p.findtext("u:Type", namespaces=NS) for p in setup.iterfind(".//u:CreatePartition", NS)]
    assert kinds == ["EFI", "MSR", "Primary"]
    assert setup.findtext(".//u:InstallTo/u:PartitionID", namespaces=NS) == "3"
    assert setup.findtext(".//u:InstallFrom/u:MetaData/u:Value", namespaces=NS) == "6"


def test_windows_11_gets_the_requirement_bypass_and_a_server_does_not():
    win11, server = answer(), answer(SERVER_2022)
    assert "BypassTPMCheck" in ET.tostring(_pass(win11, "windowsPE"), encoding="unicode")
    assert "BypassNRO" in ET.tostring(_pass(win11, "specialize"), encoding="unicode")
    text = ET.tostring(server, encoding="unicode")
    assert "LabConfig" not in text and "BypassNRO" not in text
    assert server.findtext(".//u:InstallFrom/u:MetaData/u:Value", namespaces=NS) == "2"


def test_the_product_key_is_there_only_when_given_and_the_language_everywhere():
    assert answer().find(".//u:ProductKey", NS) is None
    root = answer(key="VK7JG-NPHTM-C97JM-9MPGT-3V66T", language="de-DE")
    assert root.findtext(".//u:ProductKey/u:Key", namespaces=NS) == "VK7JG-NPHTM-C97JM-9MPGT-3V66T"
    names = {f"{{{UNATTEND_NS}}}{n}" for n in ("UILanguage", "SystemLocale", "UserLocale", "InputLocale")}
    languages = [el.text for el in root.iter() if el.tag in names]
    assert len(languages) == 9 and set(languages) == {"de-DE"}  # WinPE 5 (Setup's UI too), OOBE 4


def test_the_admin_logs_on_by_itself_and_oobe_asks_nothing():
    shell = _pass(answer(), "oobeSystem").find("u:component[@name='Microsoft-Windows-Shell-Setup']", NS)
    assert [child.tag.split("}")[1] for child in shell] == ["UserAccounts", "AutoLogon", "OOBE", "FirstLogonCommands"]
    account = shell.find(".//u:LocalAccount", NS)
    assert (account.findtext("u:Name", namespaces=NS), account.findtext("u:Group", namespaces=NS)) == (
        contract.ADMIN_USER, "Administrators")
    assert shell.findtext("u:AutoLogon/u:Password/u:Value", namespaces=NS) == "Golden-Password-1"
    assert all(el.text == "true" for el in shell.find("u:OOBE", NS) if el.tag.endswith(("Page", "Screen", "OOBE",
                                                                                        "Screens")))


def test_the_first_logon_command_passes_every_parameter_firstlogon_ps1_declares():
    lines = FirstLogon(1920, 1080).lines()
    declared = set(re.findall(r"\[(?:string|int)\]\$(\w+)", FIRSTLOGON.read_text().split(")\n", 1)[0]))
    passed = set(re.findall(r" -(\w+) ", lines[1] + " ")) - {"NoProfile", "ExecutionPolicy", "File"}
    assert passed == declared
    assert f"-LaunchTask {contract.VMD_LAUNCH_TASK} " in lines[1] and "-Width 1920 -Height 1080" in lines[1]
    assert f"-Share {contract.SHARE_UNC} -ShareLetter {contract.SHARE_LETTER}" in lines[1]
