"""Built guest images, what a machine boots: where they live, what their manifest says,
and which one is current.

An image is a folder `<images_dir>/<name>-<recipe hash>/` holding a read-only qcow2 base
and `manifest.json`. The hash covers every file of the recipe (`vmd/images/<name>/`), so a
changed recipe builds a new image and an unchanged one is never rebuilt; CI keeps the
images folder outside the clone as its cache. The recipes and their builds are
vmd/images/'s; this module reads them only as bytes, for the hash.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from vmd.config import VmdConfig
from vmd.errors import WordedError

# The recipes, one folder per image (vmd/images/<name>/), in a clone and in the editable
# install of the containers.
RECIPES_DIR = Path(__file__).resolve().parents[1] / "images"


class ImageMissing(WordedError, LookupError):
    """No built image for a name; the message says how to build one."""


class Image(BaseModel):
    name: str
    os_family: str  # "linux" | "windows"
    distro: str = ""
    user: str
    project_path: str
    resolution: tuple[int, int]
    desktop: bool
    disk: str = "disk.qcow2"
    kernel: str | None = None
    initrd: str | None = None
    kernel_args: str = ""
    ssh_key: str = "id_ed25519"
    kernel_version: str = ""
    # How a guest of the image boots and gets the project folder (vmd/machines/boot_share.py).
    # The defaults are the Debian image's, whose manifest names neither: its kernel and
    # initrd from the host, the folder over virtio 9p.
    boot: Literal["kernel", "disk"] = "kernel"  # disk: from its own disk (firmware below)
    uefi: bool = False  # disk boot with OVMF instead of SeaBIOS
    tpm: bool = False  # a TPM 2.0 (swtpm): Windows 11's setup checks for one
    share: Literal["9p", "smb"] = "9p"  # smb: for guests with no 9p driver (Windows)
    # The disk's bus and the NICs' model: virtio where the guest has the drivers (Linux; a
    # Windows image built with virtio-win), else what Windows drives itself (AHCI, e1000e):
    # a Windows guest on a virtio disk it has no driver for stops at boot.
    disk_bus: Literal["virtio", "sata"] = "virtio"
    nic: Literal["virtio", "e1000e"] = "virtio"
    dir: Path = Path(".")

    def path(self, field: str) -> Path:
        return self.dir / getattr(self, field)


def images_dir(flag: str | None = None) -> Path:
    """Where images live: `flag` (--images-dir) if given, else vmd's images_dir setting
    (VMD_IMAGES_DIR, VMD_CONFIG), for a caller without vmd's config at hand."""
    return VmdConfig.load(images_dir=flag).images_dir


def recipe_hash(name: str, recipes: Path = RECIPES_DIR) -> str:
    recipe = recipes / name
    if not recipe.is_dir():
        found = recipes.iterdir() if recipes.is_dir() else ()
        known = ", ".join(sorted(p.name for p in found if p.is_dir() and not p.name.startswith(("_", ".")))) or "none"
        raise ImageMissing(f"there is no image recipe '{name}' under {recipes} (known: {known}).")
    digest = hashlib.sha256()
    files = (p for p in recipe.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in sorted(files):
        digest.update(str(path.relative_to(recipe)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def load_image(folder: Path) -> Image:
    manifest = json.loads((folder / "manifest.json").read_text())
    return Image(**manifest, dir=folder)


def find_image(name: str, root: Path | None = None, recipes: Path = RECIPES_DIR) -> Image:
    """The image for `name`: the one built from the current recipe if there is one,
    else the newest built image of that name (a host without the recipes, e.g. in a
    container, still finds what was built for it)."""
    root = root or images_dir()
    candidates: list[Path] = []
    try:
        current = root / f"{name}-{recipe_hash(name, recipes)}"
        candidates.append(current)
    except ImageMissing:
        pass
    if root.is_dir():
        built = sorted((p for p in root.glob(f"{name}-*/manifest.json") if not p.parent.name.endswith(".partial")),
                       key=lambda p: p.stat().st_mtime, reverse=True)
        candidates += [p.parent for p in built]
    for folder in candidates:
        if (folder / "manifest.json").is_file():
            return load_image(folder)
    raise ImageMissing(
        f"no '{name}' guest image in {root}: build it with `vmd images build {name}` "
        f"(or point VMD_IMAGES_DIR at the folder that holds it)."
    )
