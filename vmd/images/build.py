"""`vmd images build NAME` and `vmd images list`: an image built from its recipe,
vmd/images/NAME/, into `<images_dir>/NAME-<recipe hash>/` unless one of that hash is there.

A recipe with a `build.sh` (debian, ubuntu) is built by running it with the partial folder
as its argument, which must leave `manifest.json` there; its `STEP n/N` lines are shown as
a progress bar. Windows is built by vmd itself from the user's ISO (vmd/images/windows/build.py,
dispatched by vmd/server/cli.py). What is current is vmd/machines/images.py's (`recipe_hash`,
`find_image`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

from vmd.host_env import clean_env
from vmd.machines.images import RECIPES_DIR, Image, ImageMissing, images_dir, load_image, recipe_hash

# What a recipe's build script gets of vmd's environment besides clean_env's allow-list:
# its own VMD_* settings (the apt mirror, VMD_APT_MIRROR, is the recipe's, not vmd's) and a
# proxy where the host uses one. Never a token.
BUILD_ENV_PREFIX = "VMD_"
BUILD_ENV_PROXIES = ("http_proxy", "https_proxy", "no_proxy")


class ImageBuildError(RuntimeError):
    pass


def build_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a recipe's build script: clean_env plus the part of `environ`
    (vmd's own) that BUILD_ENV_PREFIX and BUILD_ENV_PROXIES allow. This passes variables on
    to a child rather than reading a setting, which is why it looks at the environment."""
    passed = {k: v for k, v in environ.items()
              if k.startswith(BUILD_ENV_PREFIX) or k.lower() in BUILD_ENV_PROXIES}
    return clean_env(passed)


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
