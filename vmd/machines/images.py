"""Guest images: where they live, what their manifest says, and building them.

An image is a folder `<images_dir>/<name>-<recipe hash>/` holding a read-only qcow2 base
and `manifest.json`. The hash covers every file of the recipe (`images/<name>/`), so a
changed recipe builds a new image and an unchanged one is never rebuilt; CI keeps the
images folder outside the clone as its cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal, Mapping

from pydantic import BaseModel

from vmd.config import VmdConfig
from vmd.errors import WordedError
from vmd.host_env import clean_env

# The recipes beside vmd/ in a clone (and in the editable install of the containers).
RECIPES_DIR = Path(__file__).resolve().parents[2] / "images"
# What a recipe's build script gets of vmd's environment besides clean_env's allow-list:
# its own VMD_* settings (the apt mirror, VMD_APT_MIRROR, is the recipe's, not vmd's) and a
# proxy where the host uses one. Never a token.
BUILD_ENV_PREFIX = "VMD_"
BUILD_ENV_PROXIES = ("http_proxy", "https_proxy", "no_proxy")


class ImageMissing(WordedError, LookupError):
    """No built image for a name; the message says how to build one."""


class ImageBuildError(RuntimeError):
    pass


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


def build_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a recipe's build script: clean_env plus the part of `environ`
    (vmd's own) that BUILD_ENV_PREFIX and BUILD_ENV_PROXIES allow. This passes variables on
    to a child rather than reading a setting, which is why it looks at the environment."""
    passed = {k: v for k, v in environ.items()
              if k.startswith(BUILD_ENV_PREFIX) or k.lower() in BUILD_ENV_PROXIES}
    return clean_env(passed)


def recipe_hash(name: str, recipes: Path = RECIPES_DIR) -> str:
    recipe = recipes / name
    if not recipe.is_dir():
        found = recipes.iterdir() if recipes.is_dir() else ()
        known = ", ".join(sorted(p.name for p in found if p.is_dir())) or "none"
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


def build(name: str, root: Path | None = None, out=sys.stdout, recipes: Path = RECIPES_DIR) -> Image:
    """Build `name` from its recipe under `recipes` unless an image of the same recipe hash
    exists: `bash <recipe>/build.sh <partial folder>`, which must leave manifest.json there."""
    root = root or images_dir()
    target = root / f"{name}-{recipe_hash(name, recipes)}"
    if (target / "manifest.json").is_file():
        print(f"{name}: up to date ({target})", file=out)
        return load_image(target)
    script = recipes / name / "build.sh"
    if not script.is_file():
        raise ImageBuildError(
            f"the '{name}' recipe cannot be built on this host ({script} does not exist); "
            f"see {recipes / name / 'README.md'}."
        )
    root.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log_path = root / f"{target.name}.log"
    started = time.monotonic()
    print(f"{name}: building {target.name} (log: {log_path})", file=out, flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["bash", str(script), str(partial)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1, env=build_env(os.environ))
        for line in proc.stdout:
            log.write(line)
            log.flush()
            shown = _progress_line(line, time.monotonic() - started)
            if shown:
                print(shown, file=out, flush=True)
        code = proc.wait()
    if code != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
        raise ImageBuildError(f"building {name} failed (exit {code}); the end of {log_path}:\n{tail}")
    partial.rename(target)
    print(f"{name}: ready in {time.monotonic() - started:.0f} s at {target}", file=out, flush=True)
    return load_image(target)


_STEP = re.compile(r"^STEP (\d+)/(\d+) (.*)")


def _progress_line(line: str, elapsed: float) -> str | None:
    m = _STEP.match(line)
    if m:
        done, total, text = int(m[1]) - 1, int(m[2]), m[3]
        bar = "#" * (20 * done // total) + "." * (20 - 20 * done // total)
        return f"[{bar}] {m[1]}/{total} {elapsed:5.0f}s  {text}"
    if line.startswith("  I: "):
        return f"{'':24}{elapsed:5.0f}s    {line.strip()[3:]}"
    return None


def cli_build(args) -> int:
    try:
        root = images_dir(args.images_dir)
    except (FileNotFoundError, ValueError) as exc:  # vmd's configuration cannot be used
        print(f"vmd images build: {exc}", file=sys.stderr)
        return 2
    try:
        build(args.name, root)
    except (ImageMissing, ImageBuildError) as exc:
        print(f"vmd images build: {exc}", file=sys.stderr)
        return 1
    return 0


def cli_list(args) -> int:
    try:
        root = images_dir(args.images_dir)
    except (FileNotFoundError, ValueError) as exc:  # vmd's configuration cannot be used
        print(f"vmd images list: {exc}", file=sys.stderr)
        return 2
    found = sorted(root.glob("*/manifest.json")) if root.is_dir() else []
    if not found:
        print(f"no images in {root}; build one with `vmd images build debian`")
    for manifest in found:
        image = load_image(manifest.parent)
        print(f"{manifest.parent.name:32} {image.os_family:8} {image.resolution[0]}x{image.resolution[1]}"
              f" desktop={'yes' if image.desktop else 'no'}")
    return 0
