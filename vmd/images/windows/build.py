"""`vmd images build windows --iso PATH`: the Windows guest image, from the user's own ISO.

Steps (each printed as `STEP n/N`, like vmd/images/debian/build.sh):
read the editions, check the host (KVM, OVMF, swtpm: refused before anything slow), hash the
ISO and the recipe, render the answer file, write the seed, install, compress, write the
manifest. The image lands in `<images_dir>/windows-<recipe hash>/` like every image; the
hash covers the files that shape the guest (RECIPE_FILES), the ISO's sha256 and every option, so an unchanged build
is never repeated. vmd never downloads Windows media, drivers or the OpenSSH MSI.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from vmd.config import VmdConfig
from vmd.guests.windows import contract
from vmd.host_env import clean_env
from vmd.images.windows.answer_file import AdminAccount, AnswerFile, FirstLogon, Language, UserData
from vmd.images.windows.boot_medium import MEDIUM_FILE, no_prompt_medium
from vmd.images.windows.editions import SUPPLY_HINT, Edition, MediaError, pick_edition, read_editions
from vmd.images.windows.install import (InstallFailed, compress_base, free_port, host_problems, make_disk,
                                        run_install, sshd_takes_key, unreachable)
from vmd.images.windows.install_domain import DISK_GB, device_set_xml, install_domain
from vmd.images.windows.seed import seed_files, write_seed
from vmd.machines.accel import kvm_works
from vmd.machines.images import Image

VMD_DIR = Path(__file__).resolve().parents[2]
# The files that decide what the installed guest is (its answer file, its first logon, its
# media, the contract it keeps), under vmd/: a change to one rebuilds the image (40 minutes);
# the build's own plumbing and the doctor's check do not. The machine it is installed on is
# hashed as its device set (install_domain.device_set_xml), not as the files that write it.
RECIPE_FILES = ("guests/windows/contract.py", "images/windows/answer_file.py", "images/windows/product_keys.py",
                "images/windows/firstlogon.ps1", "images/windows/seed.py")
IMAGE_NAME = "windows"
# What step 4 says of the key, so a build that stops at Setup's key page has been warned.
KEY_FORMS = {"yours": "yours (--key)",
             "generic": "the edition's generic key (it installs the edition and activates nothing)",
             "none": "none known for this edition (evaluation media need none); if Setup stops at its "
                     "product key page, rebuild with --key"}
TOTAL_STEPS = 8
DEFAULT_RESOLUTION = (1280, 800)  # the Debian image's, so screenshots cost the model the same
HASH_CHUNK = 4 * 1024 * 1024
PASSWORD_FILE = "admin-password"


class WindowsBuildOptions(BaseModel):
    """What the person gave `vmd images build windows` (checked here, at the edge)."""
    model_config = ConfigDict(frozen=True)
    iso: Path
    edition: str | None = None
    key: str | None = None
    virtio_win: Path | None = None
    openssh_msi: Path | None = None
    language: str | None = None
    resolution: tuple[int, int] = DEFAULT_RESOLUTION

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9A-Za-z]{5}(-[0-9A-Za-z]{5}){4}", value.strip()):
            raise ValueError("a Windows product key is five groups of five letters or digits: XXXXX-XXXXX-XXXXX-XXXXX-XXXXX")
        return value.strip().upper() if value else None

    @field_validator("language")
    @classmethod
    def _language(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z]{2,3}-[A-Za-z]{2,4}(-[A-Za-z]{2})?", value):
            raise ValueError("--language takes a Windows language tag such as en-US or de-DE")
        return value

    @field_validator("resolution", mode="before")
    @classmethod
    def _resolution(cls, value):
        if isinstance(value, str):
            m = re.fullmatch(r"(\d{3,4})x(\d{3,4})", value.strip())
            if not m:
                raise ValueError("--resolution takes WIDTHxHEIGHT, such as 1280x800")
            value = (int(m[1]), int(m[2]))
        if not (800 <= value[0] <= 3840 and 600 <= value[1] <= 2160):
            raise ValueError("--resolution must be between 800x600 and 3840x2160")
        return value


def step(n: int, text: str, out) -> None:
    print(f"STEP {n}/{TOTAL_STEPS} {text}", file=out, flush=True)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def guest_image(options: WindowsBuildOptions, edition: Edition, folder: Path) -> Image:
    """The image being built, as far as its machines' devices go: the fields of its manifest
    that vmd/machines/device_set.py reads, for the install machine and every session's."""
    return Image(
        name=IMAGE_NAME, os_family="windows", user=contract.ADMIN_USER, project_path=contract.PROJECT_PATH,
        resolution=options.resolution, desktop=True,
        # Boot from its own disk with OVMF, a TPM for Windows 11, the project over SMB (no 9p
        # driver on Windows).
        boot="disk", uefi=True, tpm=edition.is_windows11, share="smb",
        # The devices the installed Windows has drivers for: virtio with virtio-win's, else
        # AHCI and e1000e, which Windows drives itself (images.py `Image.disk_bus`, `nic`).
        disk_bus="virtio" if options.virtio_win else "sata", nic="virtio" if options.virtio_win else "e1000e",
        dir=folder)


def recipe_hash(options: WindowsBuildOptions, iso_sha256: str, edition: Edition, language: str) -> str:
    """RECIPE_FILES, the install machine's devices, the ISO, the chosen edition and every
    option (the key only as a hash)."""
    digest = hashlib.sha256()
    for name in RECIPE_FILES:
        digest.update(name.encode() + b"\0" + (VMD_DIR / name).read_bytes() + b"\0")
    digest.update(device_set_xml(guest_image(options, edition, Path("/image"))).encode() + b"\0")
    extras = [iso_sha256, str(edition.index), language, f"{options.resolution[0]}x{options.resolution[1]}",
              hashlib.sha256((options.key or "").encode()).hexdigest(),
              file_sha256(options.virtio_win) if options.virtio_win else "",
              file_sha256(options.openssh_msi) if options.openssh_msi else ""]
    digest.update("\0".join(extras).encode())
    return digest.hexdigest()[:16]


def admin_password() -> str:
    """Random, and meeting Windows Server's complexity rule (upper, lower, digit, symbol)."""
    return secrets.token_urlsafe(18) + "-Aa1"


def write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def login_key(folder: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vmd", "-f", str(folder / "id_ed25519")],
                   check=True, capture_output=True, env=clean_env())
    return (folder / "id_ed25519.pub").read_text()


def build_windows(options: WindowsBuildOptions, root: Path, out=None, uri: str = "qemu:///system",
                  kvm_usable: Callable[[], bool] | None = None, install: Callable = run_install) -> Path:
    """Build (or find up to date) the Windows image; returns its folder. Raises MediaError
    or InstallFailed with a sentence."""
    out = out or sys.stdout
    started = time.monotonic()
    step(1, f"read the editions on {options.iso}", out)
    edition = pick_edition(read_editions(options.iso), options.edition)
    print(f"  {edition.line()}", file=out, flush=True)

    step(2, "check this host can run Windows Setup (KVM, OVMF, swtpm)", out)
    # QEMU itself is asked (accel.kvm_works): a kernel of an image in `root` (or the host's), else
    # OVMF, booted under KVM, since on a nested host KVM can start and still run nothing.
    problems = host_problems(kvm_usable or (lambda: kvm_works(root)), tpm=edition.is_windows11)
    problems += unreachable([options.iso, root / "folder"])
    if problems:
        raise InstallFailed(" ".join(problems))

    step(3, "hash the ISO and the recipe", out)
    language = options.language or (edition.languages[0] if edition.languages else "en-US")
    iso_sha256 = file_sha256(options.iso)
    target = root / f"{IMAGE_NAME}-{recipe_hash(options, iso_sha256, edition, language)}"
    if (target / "manifest.json").is_file():
        print(f"{IMAGE_NAME}: up to date ({target})", file=out, flush=True)
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    # 0711: QEMU (another user) must pass through to the seed and the disk; nobody may list it.
    partial.mkdir(parents=True, mode=0o711)
    partial.chmod(0o711)  # mkdir's mode is cut by the umask

    step(4, f"render Autounattend.xml ({edition.name}, {language})", out)
    password = admin_password()
    write_private(partial / PASSWORD_FILE, password + "\n")
    public_key = login_key(partial)
    user_data = UserData(options.key)
    answer = AnswerFile(edition, Language(language), AdminAccount(password),
                        FirstLogon(*options.resolution), user_data).to_xml()
    print(f"  product key: {KEY_FORMS[user_data.key_form(edition)[0]]}", file=out, flush=True)

    step(5, "write the seed medium (answer file, drivers, first logon script)", out)
    seed = write_seed(seed_files(answer, public_key, edition, options.virtio_win, options.openssh_msi),
                      partial / "seed.iso")
    os.chmod(seed, 0o600)  # it holds the password in the answer file

    step(6, "install Windows (20-40 min under KVM)", out)
    work_disk = partial / "install.qcow2"
    make_disk(work_disk, DISK_GB)
    serial_log = partial / "serial.log"
    image = guest_image(options, edition, partial)
    boot = no_prompt_medium(options.iso.resolve(), partial)
    print(f"  install CD: {boot.note}", file=out, flush=True)
    port = free_port()
    domain = install_domain(image, name=f"vmd-windows-build-{target.name[-16:]}", disk=work_disk,
                            medium=boot.medium, seed_iso=seed, serial_log=serial_log, ssh_port=port)
    install(domain.to_xml(), serial_log, uri, out, press_keys=not boot.no_prompt,
            ssh_check=sshd_takes_key(port, contract.ADMIN_USER, partial / "id_ed25519"))

    step(7, "compress the disk into the base image", out)
    compress_base(work_disk, partial / "disk.qcow2")
    for leftover in (work_disk, seed, partial / MEDIUM_FILE):  # the seed holds the password; the manifest folder keeps it alone
        leftover.unlink(missing_ok=True)

    step(8, "write the manifest", out)
    manifest = {
        **image.model_dump(mode="json", exclude={"dir", "kernel", "initrd", "kernel_args", "kernel_version"}),
        "distro": f"windows-{edition.edition_id.lower()}-{edition.build}", "disk": "disk.qcow2", "ssh_key": "id_ed25519",
        "edition": edition.name, "edition_id": edition.edition_id, "edition_index": edition.index,
        "build": edition.build, "language": language, "iso_sha256": iso_sha256, "recipe": target.name.split("-")[-1],
        "uefi_vars": "OVMF_VARS.fd",  # the install's variable store; the ESP's fallback loader boots without it
        "admin_password_file": PASSWORD_FILE,
    }
    (partial / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    partial.rename(target)
    print(f"{IMAGE_NAME}: ready in {time.monotonic() - started:.0f} s at {target}", file=out, flush=True)
    return target


def cli_build_windows(args) -> int:
    if not args.iso:
        print(f"vmd images build windows: no install ISO given; {SUPPLY_HINT}.", file=sys.stderr)
        return 2
    try:
        options = WindowsBuildOptions(
            iso=Path(args.iso), edition=args.edition, key=args.key,
            virtio_win=Path(args.virtio_win) if args.virtio_win else None,
            openssh_msi=Path(args.openssh_msi) if args.openssh_msi else None,
            language=args.language, resolution=args.resolution or DEFAULT_RESOLUTION)
    except ValidationError as exc:  # each option's own sentence, from its validator
        print("vmd images build windows: " + "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors()),
              file=sys.stderr)
        return 2
    try:
        config = VmdConfig.load(images_dir=args.images_dir)
    except (FileNotFoundError, ValueError) as exc:  # vmd's configuration cannot be used
        print(f"vmd images build windows: {exc}", file=sys.stderr)
        return 2
    try:
        build_windows(options, config.images_dir, uri=config.libvirt_uri)
    except (MediaError, InstallFailed) as exc:
        print(f"vmd images build windows: {exc}", file=sys.stderr)
        return 1
    return 0
