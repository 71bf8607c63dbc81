"""The generic key of each edition, written in the answer file when the user gives none.

Retail Windows 11 media (several editions, no ei.cfg) stop at Setup's product key page
unless the answer file names a key, and the key also picks the edition. These are the
public generic (install-only) and KMS client setup keys: they let Setup install the
edition and activate nothing by themselves (a KMS client key only against an organisation's
KMS host), so the licence stays the user's (--key, or activation later). dockur/windows, which installs these editions unattended every day, writes one
in `UserData/ProductKey/Key` of each answer file (assets/win11x64.xml: Pro;
win11x64-enterprise.xml: Enterprise; win2016/2019/2022/2025.xml: Server Standard); the
client editions dockur has no file for are the generic keys Microsoft's Media Creation
Tool presets by EditionID (sources/product.ini, as AveYo's MediaCreationTool.bat lists
them), the Datacenter ones from Microsoft Learn's "KMS client activation and product keys".

Keys are looked up by the WIM's exact EDITIONID, so evaluation media (EDITIONID
...Eval, which take no key and refuse a non-evaluation one) get none.
"""

from __future__ import annotations

from vmd.images.windows.editions import Edition

# Windows 10 and 11 share their generic keys (11 is 10.0 build 22000 and later).
CLIENT_KEYS = {
    "Core": "YTMG3-N6DKC-DKB77-7M9GH-8HVX7",  # Home
    "CoreN": "4CPRK-NM3K3-X6XXQ-RXX86-WXCHW",
    "CoreSingleLanguage": "BT79Q-G7N6G-PGBYW-4YWX6-6F4BT",
    "Professional": "VK7JG-NPHTM-C97JM-9MPGT-3V66T",  # dockur assets/win11x64.xml
    "ProfessionalN": "2B87N-8KFHP-DKV6R-Y2C8J-PKCKT",
    "ProfessionalWorkstation": "DXG7C-N36C4-C4HTG-X4T3X-2YV77",
    "ProfessionalEducation": "8PTT6-RNW4C-6V7J2-C2D3X-MHBPB",
    "Education": "YNMGQ-8RYV3-4PGQ3-C8XTP-7CFBY",
    "Enterprise": "NPPR9-FWDCX-D2C8J-H872K-2YT43",  # dockur assets/win11x64-enterprise.xml
}
# Server keys differ per release: keyed by Edition.family (2k16 ... 2k25).
SERVER_KEYS = {
    ("ServerStandard", "2k25"): "TVRH6-WHNXV-R9WG3-9XRFY-MY832",  # dockur assets/win2025.xml
    ("ServerDatacenter", "2k25"): "D764K-2NDRG-47T6Q-P8T8W-YP6DF",
    ("ServerStandard", "2k22"): "VDYBN-27WPP-V4HQT-9VMD4-VMK7H",  # dockur assets/win2022.xml
    ("ServerDatacenter", "2k22"): "WX4NM-KYWYW-QJJR4-XV3QB-6VM33",
    ("ServerStandard", "2k19"): "N69G4-B89J2-4G8F4-WWYCC-J464C",  # dockur assets/win2019.xml
    ("ServerDatacenter", "2k19"): "WMDGN-G9PQG-XVVXX-R3X43-63DFG",
    ("ServerStandard", "2k16"): "WC2BQ-8NRM3-FDDYY-2BFGV-KHKQY",  # dockur assets/win2016.xml
    ("ServerDatacenter", "2k16"): "CB7KF-BWN84-R7R2Y-793K2-8XDDG",
}


def generic_key(edition: Edition) -> str | None:
    """The edition's generic key, or None when none is known (evaluation and rarer editions)."""
    if edition.is_server:
        return SERVER_KEYS.get((edition.edition_id, edition.family))
    return CLIENT_KEYS.get(edition.edition_id)
