"""Autounattend.xml built from small typed pieces, the way domain_xml.py builds libvirt XML.

Element names, passes and components follow Microsoft's unattend reference (Windows Setup
Automation Overview; Microsoft-Windows-Setup | DiskConfiguration, ImageInstall/OSImage/
InstallFrom/MetaData, UserData/ProductKey; Microsoft-Windows-Shell-Setup | UserAccounts,
AutoLogon, OOBE, FirstLogonCommands; Microsoft-Windows-International-Core[-WinPE]); dockur/
windows' assets/win11x64.xml is a working example of the same shape. Passes used:
windowsPE (language, disk, image, key, Windows 11 requirement bypass), specialize (computer
name, BypassNRO) and oobeSystem (language, accounts, autologon, OOBE, the first logon command).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from vmd.guests.windows import contract
from vmd.images.windows.editions import Edition
from vmd.images.windows.product_keys import generic_key

UNATTEND_NS = "urn:schemas-microsoft-com:unattend"
WCM_NS = "http://schemas.microsoft.com/WMIConfig/2002/State"
ET.register_namespace("", UNATTEND_NS)
ET.register_namespace("wcm", WCM_NS)
ADD = {f"{{{WCM_NS}}}action": "add"}
# The computer name: NetBIOS names stop at 15 characters.
COMPUTER_NAME = "VMAGENT-GUEST"
# Partition sizes in MB: Microsoft's recommended UEFI/GPT layout (EFI 100 MB, FAT32; MSR 16 MB).
EFI_MB = 100
MSR_MB = 16


def _tag(name: str) -> str:
    return f"{{{UNATTEND_NS}}}{name}"


def _sub(parent: ET.Element, tag: str, text: str | None = None, attrs: dict | None = None) -> ET.Element:
    el = ET.SubElement(parent, _tag(tag), attrs or {})
    if text is not None:
        el.text = text
    return el


def _component(settings: ET.Element, name: str) -> ET.Element:
    return _sub(settings, "component", attrs={
        "name": name, "processorArchitecture": "amd64", "publicKeyToken": "31bf3856ad364e35",
        "language": "neutral", "versionScope": "nonSxS"})


def _commands(parent: ET.Element, list_tag: str, item_tag: str, text_tag: str, lines: list[str]) -> None:
    listing = _sub(parent, list_tag)
    for order, line in enumerate(lines, 1):
        item = _sub(listing, item_tag, attrs=ADD)
        _sub(item, "Order", str(order))
        _sub(item, text_tag, line)


@dataclass
class Language:
    """One language for Setup's UI, the installed system, input and formats (e.g. en-US)."""
    tag: str

    def write(self, component: ET.Element, winpe: bool) -> None:
        if winpe:
            setup_ui = _sub(component, "SetupUILanguage")
            _sub(setup_ui, "UILanguage", self.tag)
        # InputLocale takes a language name as well as a 0409:00000409 pair.
        for name in ("InputLocale", "SystemLocale", "UILanguage", "UserLocale"):
            _sub(component, name, self.tag)


@dataclass
class UefiGptDisk:
    """Disk 0 wiped and laid out for UEFI: EFI system (FAT32), MSR, then Windows (NTFS, C:)."""
    disk_id: int = 0

    def write(self, setup: ET.Element) -> None:
        disk = _sub(_sub(setup, "DiskConfiguration"), "Disk", attrs=ADD)
        _sub(disk, "DiskID", str(self.disk_id))
        _sub(disk, "WillWipeDisk", "true")
        create = _sub(disk, "CreatePartitions")
        for order, (kind, size) in enumerate((("EFI", EFI_MB), ("MSR", MSR_MB), ("Primary", None)), 1):
            part = _sub(create, "CreatePartition", attrs=ADD)
            _sub(part, "Order", str(order))
            _sub(part, "Type", kind)
            _sub(part, "Size", str(size)) if size else _sub(part, "Extend", "true")
        modify = _sub(disk, "ModifyPartitions")
        for order, extra in enumerate(({"Label": "System", "Format": "FAT32"}, {},
                                       {"Label": "Windows", "Letter": "C", "Format": "NTFS"}), 1):
            part = _sub(modify, "ModifyPartition", attrs=ADD)
            _sub(part, "Order", str(order))
            _sub(part, "PartitionID", str(order))
            for name, value in extra.items():
                _sub(part, name, value)

    @property
    def windows_partition(self) -> int:
        return 3


@dataclass
class ImageChoice:
    """Which image of install.wim to install: by index, the one unambiguous key (names repeat
    across languages on multi-language media)."""
    index: int

    def write(self, setup: ET.Element, disk: UefiGptDisk) -> None:
        os_image = _sub(_sub(setup, "ImageInstall"), "OSImage")
        meta = _sub(_sub(os_image, "InstallFrom"), "MetaData", attrs=ADD)
        _sub(meta, "Key", "/IMAGE/INDEX")
        _sub(meta, "Value", str(self.index))
        install_to = _sub(os_image, "InstallTo")
        _sub(install_to, "DiskID", str(disk.disk_id))
        _sub(install_to, "PartitionID", str(disk.windows_partition))
        _sub(os_image, "InstallToAvailablePartition", "false")


@dataclass
class UserData:
    """EULA accepted, and the key that keeps Setup off its product key page: the user's own,
    else the edition's generic key (product_keys.py), else an empty ProductKey."""
    product_key: str | None = None

    def key_form(self, edition: Edition) -> tuple[str, str | None]:
        """("yours" | "generic" | "none", the key written)."""
        if self.product_key:
            return "yours", self.product_key
        generic = generic_key(edition)
        return ("generic", generic) if generic else ("none", None)

    def write(self, setup: ET.Element, edition: Edition) -> None:
        data = _sub(setup, "UserData")
        _sub(data, "AcceptEula", "true")
        _sub(data, "FullName", contract.ADMIN_USER)
        _sub(data, "Organization", "vmagent")
        form, value = self.key_form(edition)
        key = _sub(data, "ProductKey")
        if value:
            _sub(key, "Key", value)
        if form != "generic":
            # Never: Setup shows no key page to wait at (for the build's 2 h bound), as before
            # for the user's key. No key known: dockur's fallback for such media (src/answer.sh,
            # removeEmbeddedProductKeys) keeps the ProductKey node without a Key; Never hides
            # the page where the media would show it.
            _sub(key, "WillShowUI", "Never")
        # A generic key is written as dockur writes it (assets/win11x64.xml, win2022.xml,
        # win2025.xml: Key alone, WillShowUI left at its default, OnError).


AUTOLOGON_COUNT = 65432


@dataclass
class AdminAccount:
    """The local administrator vmd logs in as, logged on automatically at the desktop."""
    password: str
    name: str = contract.ADMIN_USER

    def write(self, shell: ET.Element) -> None:
        users = _sub(shell, "UserAccounts")
        accounts = _sub(users, "LocalAccounts")
        account = _sub(accounts, "LocalAccount", attrs=ADD)
        _sub(account, "Name", self.name)
        _sub(account, "DisplayName", self.name)
        _sub(account, "Group", "Administrators")
        self._password(account)
        # Windows Server's OOBE stops at "Customize settings" to ask the built-in
        # Administrator's password unless the answer file sets it; dockur's win2022.xml and
        # win2025.xml (and its client files) set it here, after LocalAccounts. The same
        # password as the agent's, so the image folder keeps one (admin-password); client
        # editions keep that account disabled.
        self._password(_sub(users, "AdministratorPassword"), wrap=False)
        logon = _sub(shell, "AutoLogon")
        _sub(logon, "Username", self.name)
        _sub(logon, "Enabled", "true")
        # For good: Winlogon counts this down at each autologon and, at zero, turns autologon
        # off and deletes the stored password; dockur's answer files give this count.
        # firstlogon.ps1 checks it is in place.
        _sub(logon, "LogonCount", str(AUTOLOGON_COUNT))
        self._password(logon)

    def _password(self, parent: ET.Element, wrap: bool = True) -> None:
        # LocalAccount and AutoLogon hold a Password element; AdministratorPassword is one.
        password = _sub(parent, "Password") if wrap else parent
        _sub(password, "Value", self.password)
        _sub(password, "PlainText", "true")


@dataclass
class HiddenOobe:
    def write(self, shell: ET.Element) -> None:
        oobe = _sub(shell, "OOBE")
        for name in ("HideEULAPage", "HideLocalAccountScreen", "HideOEMRegistrationScreen",
                     "HideOnlineAccountScreens", "HideWirelessSetupInOOBE"):
            _sub(oobe, name, "true")
        _sub(oobe, "ProtectYourPC", "3")  # no recommended settings, no telemetry prompts


# Windows 11 Setup refuses a machine without TPM 2.0, Secure Boot or 4 GiB; the install
# domain has a TPM (swtpm) but the checks are bypassed as well so that a host without
# swtpm's newest features still installs (HKLM\SYSTEM\Setup\LabConfig, read by Setup in WinPE).
WIN11_LABCONFIG = ("BypassTPMCheck", "BypassSecureBootCheck", "BypassRAMCheck", "BypassCPUCheck")


def _reg_dword(key: str, value: str) -> str:
    return f'reg.exe add "{key}" /v {value} /t REG_DWORD /d 1 /f'


# FirstLogonCommands' CommandLine holds at most 1024 characters (Microsoft's SynchronousCommand/
# CommandLine page).
COMMAND_LINE_MAX = 1024


def _ps_quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# How long firstlogon.ps1 gives each way of installing OpenSSH Server (the capability, which
# Windows downloads from Windows Update, then the MSI): a few MB that take seconds where
# Windows Update answers; past this it is taken as unreachable, and the next way is tried.
OPENSSH_INSTALL_TIMEOUT_S = 900


@dataclass
class FirstLogon:
    """Copy vmd's folder off the seed (found by its volume label) and run firstlogon.ps1, in
    one command: Windows now starts the SynchronousCommand entries of FirstLogonCommands
    at the same time (Microsoft's SynchronousCommand/Order page), so a second entry that runs
    the script could start before the first one has copied it."""
    width: int
    height: int

    def command(self) -> str:
        script = f"{contract.GUEST_VMD_DIR}\\firstlogon.ps1"
        params = {"User": contract.ADMIN_USER, "Width": str(self.width), "Height": str(self.height),
                  "LaunchTask": contract.VMD_LAUNCH_TASK, "LaunchRequest": contract.LAUNCH_REQUEST,
                  "Share": contract.SHARE_UNC, "ShareLetter": contract.SHARE_LETTER,
                  "ReadyMarker": contract.READY_MARKER, "OpenSshTimeoutS": str(OPENSSH_INSTALL_TIMEOUT_S)}
        # Quoted, since -Command parses them as PowerShell (the old -File form took them raw).
        arguments = " ".join(f"-{name} {value if value.isdigit() else _ps_quote(value)}"
                             for name, value in params.items())
        # Stop: a failed copy must not go on to run a script that is not there. The build
        # reads the outcome on COM1 (the script's steps), not this command's exit status, so
        # a failure before the script runs (no seed found, the copy, a script that does not
        # parse) is written there too, in the script's own failure form; without it the
        # build waited out its 2-hour bound.
        body = (f"$ErrorActionPreference = 'Stop'; try {{ "
                f"$d = (Get-Volume -FileSystemLabel {contract.SEED_LABEL}).DriveLetter; "
                f"Copy-Item -Recurse -Force ($d + ':\\$OEM$\\$1\\vmd') 'C:\\'; "
                f"& {_ps_quote(script)} {arguments} }} catch {{ "
                f"$p = New-Object IO.Ports.SerialPort 'COM1'; $p.Open(); "
                f"$p.WriteLine('vmd: {contract.FAILED_MARKER}: before firstlogon.ps1 ran: ' + $_); $p.Close(); exit 1 }}")
        line = f'powershell.exe -NoProfile -ExecutionPolicy Bypass -Command "{body}"'
        if len(line) > COMMAND_LINE_MAX or '"' in body:
            raise ValueError(f"the first logon command cannot be written in one CommandLine: {line}")
        return line

    def write(self, shell: ET.Element) -> None:
        item = _sub(_sub(shell, "FirstLogonCommands"), "SynchronousCommand", attrs=ADD)
        _sub(item, "Order", "1")
        _sub(item, "CommandLine", self.command())
        _sub(item, "RequiresUserInput", "false")


@dataclass
class AnswerFile:
    edition: Edition
    language: Language
    account: AdminAccount
    first_logon: FirstLogon
    user_data: UserData = field(default_factory=UserData)
    disk: UefiGptDisk = field(default_factory=UefiGptDisk)

    def to_element(self) -> ET.Element:
        root = ET.Element(_tag("unattend"))
        pe = _sub(root, "settings", attrs={"pass": "windowsPE"})
        self.language.write(_component(pe, "Microsoft-Windows-International-Core-WinPE"), winpe=True)
        setup = _component(pe, "Microsoft-Windows-Setup")
        self.disk.write(setup)
        ImageChoice(self.edition.index).write(setup, self.disk)
        # No updates fetched by Setup (the install's network reaches the internet): what it
        # installs is the user's media, and nothing slows it for a download (dockur's form).
        update = _sub(setup, "DynamicUpdate")
        _sub(update, "Enable", "false")
        _sub(update, "WillShowUI", "Never")
        self.user_data.write(setup, self.edition)
        if self.edition.is_windows11:
            _commands(setup, "RunSynchronous", "RunSynchronousCommand", "Path",
                      [_reg_dword(r"HKLM\SYSTEM\Setup\LabConfig", v) for v in WIN11_LABCONFIG])

        special = _sub(root, "settings", attrs={"pass": "specialize"})
        shell = _component(special, "Microsoft-Windows-Shell-Setup")
        _sub(shell, "ComputerName", COMPUTER_NAME)
        _sub(shell, "TimeZone", "UTC")
        if self.edition.is_windows11:
            # Windows 11 OOBE otherwise insists on a network and a Microsoft account.
            _commands(_component(special, "Microsoft-Windows-Deployment"), "RunSynchronous",
                      "RunSynchronousCommand", "Path",
                      [_reg_dword(r"HKLM\SOFTWARE\Microsoft\Windows\CurrentVersion\OOBE", "BypassNRO")])

        if self.edition.is_server:
            # Server Manager (and the initial configuration tasks) open at every logon of an
            # administrator and cover the desktop the agent sees (dockur's win2022.xml).
            _sub(_component(special, "Microsoft-Windows-ServerManager-SvrMgrNc"), "DoNotOpenServerManagerAtLogon", "true")
            _sub(_component(special, "Microsoft-Windows-OutOfBoxExperience"), "DoNotOpenInitialConfigurationTasksAtLogon",
                 "true")

        oobe = _sub(root, "settings", attrs={"pass": "oobeSystem"})
        # No device encryption: Windows 11 24H2 encrypts C: with BitLocker on its own where it
        # finds a TPM (the install has swtpm's), which would lock the base image to this TPM
        # state; and no TCG security activation of the disk (dockur's win11x64.xml, both).
        _sub(_component(oobe, "Microsoft-Windows-SecureStartup-FilterDriver"), "PreventDeviceEncryption", "true")
        _sub(_component(oobe, "Microsoft-Windows-EnhancedStorage-Adm"), "TCGSecurityActivationDisabled", "1")
        self.language.write(_component(oobe, "Microsoft-Windows-International-Core"), winpe=False)
        shell = _component(oobe, "Microsoft-Windows-Shell-Setup")
        # Shell-Setup's schema orders its children: UserAccounts, AutoLogon, OOBE, FirstLogonCommands.
        self.account.write(shell)
        HiddenOobe().write(shell)
        self.first_logon.write(shell)
        return root

    def to_xml(self) -> str:
        root = self.to_element()
        ET.indent(root, "  ")
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
