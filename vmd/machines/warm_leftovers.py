"""What a warm pool's folder (vmd/machines/warm_pool.py) holds that no slot of this vmd will
serve, removed with the guests it names: slots of an older build of the image (the image
folder's name carries its recipe's hash), slots an earlier vmd claimed or was booting when it
stopped (`<id>.taken`, `.<id>.making`), and guests an earlier vmd parked (`<id>.parked`:
paused, their SSH connection gone with that vmd, they can serve no one).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Callable

from vmd.machines.host import Host
from vmd.machines.images import Image
from vmd.machines.machine import Machine
from vmd.machines.parked_slot import PARKED_SUFFIX
from vmd.machines.warm_slot import SLOT_PREFIX

log = logging.getLogger("vmd.machines.warm_leftovers")


def remove_pool_dir(pool_dir: Path, host: Host, parked_here: Callable[[Path], bool]) -> None:
    """Every slot of the pool's folder gone, half-made and parked ones' guests destroyed (but
    for the parked folders `parked_here` says this vmd's pool still holds)."""
    for image_dir in pool_dir.iterdir():
        for slot in image_dir.iterdir() if image_dir.is_dir() else ():
            if slot.name.endswith(".making"):
                discard_half_made(slot, host)
            elif slot.name.endswith(PARKED_SUFFIX) and not parked_here(slot):
                discard_parked_folder(slot, host)
    shutil.rmtree(pool_dir, ignore_errors=True)


def remove_stale_slots(pool_dir: Path, image: Image, host: Host, parked_here: Callable[[Path], bool]) -> None:
    """Slots of other builds of `image`, and claimed, half-made or parked ones of an earlier vmd
    (a parked folder `parked_here` says this vmd's pool holds stays)."""
    for folder in pool_dir.iterdir():
        if folder.name != image.dir.name and folder.name.startswith(image.name + "-"):
            for slot in folder.iterdir() if folder.is_dir() else ():
                if slot.name.endswith(PARKED_SUFFIX) and not parked_here(slot):
                    discard_parked_folder(slot, host)
            shutil.rmtree(folder, ignore_errors=True)
    mine = pool_dir / image.dir.name
    if mine.is_dir():
        for slot in mine.iterdir():
            if slot.name.endswith(".making"):  # an earlier vmd died while it booted: its guest goes too
                discard_half_made(slot, host)
            if slot.name.endswith(PARKED_SUFFIX) and not parked_here(slot):
                discard_parked_folder(slot, host)
            if slot.name.endswith(".taken") or slot.name.endswith(".making"):
                shutil.rmtree(slot, ignore_errors=True)


def discard_half_made(slot: Path, host: Host) -> None:
    """The guest of `.<id>.making`, a slot an earlier vmd was booting when it stopped."""
    try:
        Machine.discard(SLOT_PREFIX + slot.name.strip(".").removesuffix(".making"), slot, host)
    except Exception as exc:
        log.warning("could not destroy the half-made slot %s: %s", slot.name, exc)


def discard_parked_folder(folder: Path, host: Host) -> None:
    """A `<id>.parked` folder no parked slot of this vmd's pool owns, and its guest."""
    try:
        Machine.discard(SLOT_PREFIX + folder.name.removesuffix(PARKED_SUFFIX), folder, host)
    except Exception as exc:
        log.warning("could not destroy the parked guest of %s: %s", folder.name, exc)
    shutil.rmtree(folder, ignore_errors=True)
