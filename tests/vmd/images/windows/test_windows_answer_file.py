"""Autounattend.xml (vmd/images/windows/answer_file.py): a golden file per edition (Windows 11
Home and Pro with and without the user's key, Server 2022 and 2025 Standard), and element by
element the forms dockur/windows' answer files use, since those boot unattended every day.
The dockur files cited are its assets/*.xml and src/answer.sh (github.com/dockur/windows)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.support.golden import assert_golden
from vmd.guests.windows import contract
from vmd.images.windows.answer_file import (COMMAND_LINE_MAX, UNATTEND_NS, WCM_NS, AdminAccount, AnswerFile,
                                            FirstLogon, Language, UserData)
from vmd.images.windows.build import KEY_FORMS
from vmd.images.windows.editions import Edition
from vmd.images.windows.product_keys import generic_key

FIRSTLOGON = Path(__file__).resolve().parents[4] / "vmd" / "images" / "windows" / "firstlogon.ps1"
NS = {"u": UNATTEND_NS, "wcm": WCM_NS}
PASSWORD = "Golden-Password-1"
USER_KEY = "ABCDE-FGHJK-MNPQR-TVWXY-23467"  # the form of a key, no real one


def _edition(index, name, edition_id, installation_type, build):
    return Edition(index, name, name, edition_id, "x64", installation_type, 10, 0, build, ("en-US",))


WIN11_HOME = _edition(1, "Windows 11 Home", "Core", "Client", 22631)
WIN11_PRO = _edition(6, "Windows 11 Pro", "Professional", "Client", 22631)
SERVER_2022 = _edition(2, "Windows Server 2022 SERVERSTANDARD", "ServerStandard", "Server", 20348)
SERVER_2025 = _edition(2, "Windows Server 2025 SERVERSTANDARD", "ServerStandard", "Server", 26100)
SERVER_2025_EVAL = _edition(2, "Windows Server 2025 SERVERSTANDARD", "ServerStandardEval", "Server", 26100)
CASES = {"win11_home": (WIN11_HOME, None), "win11_home_key": (WIN11_HOME, USER_KEY),
         "win11_pro": (WIN11_PRO, None), "win11_pro_key": (WIN11_PRO, USER_KEY),
         "server2022_standard": (SERVER_2022, None), "server2025_standard": (SERVER_2025, None)}


def xml_text(edition=WIN11_PRO, key=None, language="en-US") -> str:
    return AnswerFile(edition, Language(language), AdminAccount(PASSWORD), FirstLogon(1280, 800),
                      UserData(key)).to_xml()


def answer(edition=WIN11_PRO, key=None, language="en-US") -> ET.Element:
    return ET.fromstring(xml_text(edition, key, language))


def _pass(root: ET.Element, name: str) -> ET.Element:
    return root.find(f"u:settings[@pass='{name}']", NS)


def _component(root: ET.Element, pass_name: str, component: str) -> ET.Element:
    return _pass(root, pass_name).find(f"u:component[@name='{component}']", NS)


def _names(parent: ET.Element) -> list[str]:
    return [child.tag.split("}")[1] for child in parent]


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_edition_matches_its_golden_file(case):
    text = xml_text(*CASES[case])
    assert_golden(f"autounattend/{case}.xml", text)


@pytest.mark.parametrize("edition,key", [(WIN11_HOME, "YTMG3-N6DKC-DKB77-7M9GH-8HVX7"),
                                         (WIN11_PRO, "VK7JG-NPHTM-C97JM-9MPGT-3V66T"),  # dockur win11x64.xml
                                         (SERVER_2022, "VDYBN-27WPP-V4HQT-9VMD4-VMK7H"),  # dockur win2022.xml
                                         (SERVER_2025, "TVRH6-WHNXV-R9WG3-9XRFY-MY832")])  # dockur win2025.xml
def test_without_a_key_the_edition_s_generic_key_is_written_as_dockur_writes_it(edition, key):
    # dockur: <UserData><ProductKey><Key>…</Key></ProductKey></UserData>, no WillShowUI.
    product = _component(answer(edition), "windowsPE", "Microsoft-Windows-Setup").find("u:UserData/u:ProductKey", NS)
    assert generic_key(edition) == key
    assert _names(product) == ["Key"] and product.findtext("u:Key", namespaces=NS) == key


@pytest.mark.parametrize("edition", [WIN11_HOME, WIN11_PRO, SERVER_2025])
def test_the_user_s_key_replaces_the_generic_one_and_never_shows_the_key_page(edition):
    product = answer(edition, key=USER_KEY).find(".//u:UserData/u:ProductKey", NS)
    assert _names(product) == ["Key", "WillShowUI"]
    assert (product.findtext("u:Key", namespaces=NS), product.findtext("u:WillShowUI", namespaces=NS)) == (
        USER_KEY, "Never")
    assert generic_key(edition) not in ET.tostring(answer(edition, key=USER_KEY), encoding="unicode")


def test_an_edition_without_a_known_key_gets_dockur_s_empty_product_key_and_no_key_page():
    # dockur src/answer.sh (removeEmbeddedProductKeys) keeps the ProductKey node without its Key
    # for media it has no key for; evaluation media take no key, and a non-evaluation one fails.
    assert generic_key(SERVER_2025_EVAL) is None
    product = answer(SERVER_2025_EVAL).find(".//u:UserData/u:ProductKey", NS)
    assert _names(product) == ["WillShowUI"] and product.findtext("u:WillShowUI", namespaces=NS) == "Never"
    assert {form for form, _ in (UserData(None).key_form(SERVER_2025_EVAL), UserData(None).key_form(WIN11_PRO),
                                 UserData(USER_KEY).key_form(WIN11_PRO))} == set(KEY_FORMS)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_administrator_password_is_set_where_dockur_sets_it(case):
    # dockur win2022.xml / win2025.xml: oobeSystem | Shell-Setup | UserAccounts holds
    # LocalAccounts, then AdministratorPassword (Value, PlainText); without it Server's OOBE
    # stops at "Customize settings" to ask for one.
    shell = _component(answer(*CASES[case]), "oobeSystem", "Microsoft-Windows-Shell-Setup")
    users = shell.find("u:UserAccounts", NS)
    assert _names(users) == ["LocalAccounts", "AdministratorPassword"]
    admin = users.find("u:AdministratorPassword", NS)
    assert _names(admin) == ["Value", "PlainText"]
    assert (admin.findtext("u:Value", namespaces=NS), admin.findtext("u:PlainText", namespaces=NS)) == (
        PASSWORD, "true")


def test_the_disk_is_gpt_for_uefi_and_windows_goes_on_the_third_partition():
    setup = _component(answer(), "windowsPE", "Microsoft-Windows-Setup")
    kinds = [p.findtext("u:Type", namespaces=NS) for p in setup.iterfind(".//u:CreatePartition", NS)]
    assert kinds == ["EFI", "MSR", "Primary"]
    assert setup.findtext(".//u:InstallTo/u:PartitionID", namespaces=NS) == "3"
    assert setup.findtext(".//u:InstallFrom/u:MetaData/u:Value", namespaces=NS) == "6"


@pytest.mark.parametrize("server", [SERVER_2022, SERVER_2025])
def test_windows_11_gets_the_requirement_bypass_and_a_server_does_not(server):
    win11, root = answer(), answer(server)
    assert "BypassTPMCheck" in ET.tostring(_pass(win11, "windowsPE"), encoding="unicode")
    assert "BypassNRO" in ET.tostring(_pass(win11, "specialize"), encoding="unicode")
    text = ET.tostring(root, encoding="unicode")
    assert "LabConfig" not in text and "BypassNRO" not in text
    assert root.findtext(".//u:InstallFrom/u:MetaData/u:Value", namespaces=NS) == "2"


def test_the_language_is_everywhere():
    root = answer(key=USER_KEY, language="de-DE")
    names = {f"{{{UNATTEND_NS}}}{n}" for n in ("UILanguage", "SystemLocale", "UserLocale", "InputLocale")}
    languages = [el.text for el in root.iter() if el.tag in names]
    assert len(languages) == 9 and set(languages) == {"de-DE"}  # WinPE 5 (Setup's UI too), OOBE 4


def test_the_admin_logs_on_by_itself_and_oobe_asks_nothing():
    shell = _component(answer(), "oobeSystem", "Microsoft-Windows-Shell-Setup")
    assert _names(shell) == ["UserAccounts", "AutoLogon", "OOBE", "FirstLogonCommands"]
    account = shell.find(".//u:LocalAccount", NS)
    assert (account.findtext("u:Name", namespaces=NS), account.findtext("u:Group", namespaces=NS)) == (
        contract.ADMIN_USER, "Administrators")
    assert shell.findtext("u:AutoLogon/u:Password/u:Value", namespaces=NS) == PASSWORD
    assert all(el.text == "true" for el in shell.find("u:OOBE", NS) if el.tag.endswith(("Page", "Screen", "OOBE",
                                                                                        "Screens")))


def test_the_first_logon_is_one_command_that_copies_then_runs():
    # Windows starts FirstLogonCommands' entries at the same time (Microsoft's SynchronousCommand/
    # Order page): one entry, as in dockur's win11x64.xml, whose one line both copies and runs.
    listing = _component(answer(), "oobeSystem", "Microsoft-Windows-Shell-Setup").find("u:FirstLogonCommands", NS)
    commands = listing.findall("u:SynchronousCommand", NS)
    assert len(commands) == 1 and len(listing) == 1
    assert commands[0].get(f"{{{WCM_NS}}}action") == "add" and commands[0].findtext("u:Order", namespaces=NS) == "1"
    line = commands[0].findtext("u:CommandLine", namespaces=NS)
    assert line == FirstLogon(1280, 800).command() and len(line) <= COMMAND_LINE_MAX
    copy, run = line.index("Copy-Item"), line.index(f"& '{contract.GUEST_VMD_DIR}\\firstlogon.ps1'")
    assert line.index("$ErrorActionPreference = 'Stop'") < copy < run


def test_the_first_logon_command_passes_every_parameter_firstlogon_ps1_declares():
    line = FirstLogon(1920, 1080).command()
    declared = set(re.findall(r"\[(?:string|int)\]\$(\w+)", FIRSTLOGON.read_text().split(")\n", 1)[0]))
    script_call = line.split("firstlogon.ps1' ", 1)[1]
    assert set(re.findall(r"(?:^| )-(\w+) ", script_call)) == declared
    assert f"-LaunchTask '{contract.VMD_LAUNCH_TASK}' " in line and "-Width 1920 -Height 1080 " in line
    assert f"-Share '{contract.SHARE_UNC}' -ShareLetter '{contract.SHARE_LETTER}'" in line


@pytest.mark.parametrize("case", sorted(CASES))
def test_setup_fetches_no_updates_and_windows_encrypts_no_disk(case):
    root = answer(*CASES[case])
    setup = _component(root, "windowsPE", "Microsoft-Windows-Setup")
    # dockur's form and place: after ImageInstall, before UserData.
    names = _names(setup)
    assert names.index("ImageInstall") < names.index("DynamicUpdate") < names.index("UserData")
    assert [(el.tag.split("}")[1], el.text) for el in setup.find("u:DynamicUpdate", NS)] == [
        ("Enable", "false"), ("WillShowUI", "Never")]
    # 24H2 turns BitLocker on by itself where it finds a TPM; the base image must stay readable.
    assert _component(root, "oobeSystem", "Microsoft-Windows-SecureStartup-FilterDriver").findtext(
        "u:PreventDeviceEncryption", namespaces=NS) == "true"
    assert _component(root, "oobeSystem", "Microsoft-Windows-EnhancedStorage-Adm").findtext(
        "u:TCGSecurityActivationDisabled", namespaces=NS) == "1"


@pytest.mark.parametrize("edition,server", [(WIN11_PRO, False), (SERVER_2022, True), (SERVER_2025, True)])
def test_server_manager_stays_closed_on_server_editions(edition, server):
    root = answer(edition)
    manager = _component(root, "specialize", "Microsoft-Windows-ServerManager-SvrMgrNc")
    tasks = _component(root, "specialize", "Microsoft-Windows-OutOfBoxExperience")
    if not server:
        assert manager is None and tasks is None  # the components are Server's alone
        return
    assert manager.findtext("u:DoNotOpenServerManagerAtLogon", namespaces=NS) == "true"
    assert tasks.findtext("u:DoNotOpenInitialConfigurationTasksAtLogon", namespaces=NS) == "true"


def test_autologon_outlasts_every_boot_and_the_first_logon_checks_it():
    # Winlogon counts LogonCount down and at zero turns autologon off and drops the password:
    # a count of 1, removed by the first logon afterwards, could end autologon after one boot.
    logon = _component(answer(), "oobeSystem", "Microsoft-Windows-Shell-Setup").find("u:AutoLogon", NS)
    count = int(logon.findtext("u:LogonCount", namespaces=NS))
    assert count == 65432  # dockur's count
    script = FIRSTLOGON.read_text()
    threshold = int(re.search(r"\[int\]\$count -lt (\d+)", script)[1])
    assert threshold < count and "Remove-ItemProperty" not in script.split("$winlogon = ", 1)[1].split("Step", 1)[0]


def test_a_failure_before_the_script_runs_is_written_on_com1_as_the_script_writes_its_own():
    line = FirstLogon(1280, 800).command()
    body = re.fullmatch(r'powershell\.exe -NoProfile -ExecutionPolicy Bypass -Command "(.*)"', line)[1]
    tried, caught = body.split(" catch { ", 1)
    assert tried.startswith("$ErrorActionPreference = 'Stop'; try { ") and "Copy-Item" in tried
    assert "New-Object IO.Ports.SerialPort 'COM1'" in caught
    assert f"WriteLine('vmd: {contract.FAILED_MARKER}: before firstlogon.ps1 ran: ' + $_)" in caught
    assert caught.rstrip().endswith("exit 1 }")
    assert f'"vmd: {contract.FAILED_MARKER}: $_"' in FIRSTLOGON.read_text()  # the script's own form
