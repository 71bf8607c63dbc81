"""The `host_info` verb: what this vmd's host holds and offers now, for the job service's
host listing (`GET /hosts`, `vmagent hosts`; past one host, through a small Ray task on
each node, vmagent/fleet/hosts.py).

Like `history` (history_verbs.py) it needs no session and acts on none: vmd/server/rpc.py
answers it on any connection from the handlers' `SESSIONLESS` table. It reads vmd's own state only: its live sessions, the warm
pools' ready slots in its state dir, the images in its images dir, and this machine's
cores, memory and room. Nothing here waits on a guest or on libvirt, so a listing of many
hosts is never held up by a busy one.
"""

from __future__ import annotations

import os
from collections import Counter

from vmd.config import VmdConfig
from vmd.contract.params import Empty
from vmd.machines.images import ImageMissing, find_image
from vmd.machines.parked_slot import parked_slots_in
from vmd.machines.warm_slot import ready_slots_in
from vmd.session.registry import Sessions


def host_info(sessions: Sessions, p: Empty) -> dict:
    config = sessions.config
    states = Counter(s.s.state for s in sessions.live() if s.s.state != "closed")
    machines = sessions.machines
    host = machines.host()
    images = [{"name": image.name, "os_family": image.os_family, "warm_slots": _warm_slots(config, image.dir.name)}
              for image in _images(config)]
    room = None
    try:
        room = host.room.no_room(config.state_dir, config.guest_memory_mib)
    except OSError as exc:  # a disk or /proc that cannot be read: said, not fatal to the listing
        room = f"the host's room could not be measured ({type(exc).__name__}: {exc})"
    sessions, warm = sum(states.values()), sum(i["warm_slots"] for i in images)
    memory_mib = _memory_mib()
    text = (f"host {host.name}: {sessions} session(s) open"
            + (f" ({', '.join(f'{n} {state}' for state, n in sorted(states.items()))})" if states else "")
            + f", {warm} warm guest(s) ready; images: "
            + (", ".join(f"{i['name']} ({i['os_family']})" for i in images) or "none built")
            + f"; {os.cpu_count() or 1} CPUs, {memory_mib} MiB memory, {config.guest_memory_mib} MiB per guest"
            + (f"; no room for a warm guest now: {room}" if room else "."))
    return {"host": host.name, "sessions": sessions, "states": dict(states), "warm_slots": warm,
            "images": images, "cpus": os.cpu_count() or 1, "memory_mib": memory_mib,
            "guest_memory_mib": config.guest_memory_mib, "room": room, "text": text}


def _images(config: VmdConfig) -> list:
    """One image per name built in the images dir: the one session_open would boot."""
    names = set()
    root = config.images_dir
    for manifest in root.glob("*/manifest.json") if root.is_dir() else ():
        if manifest.parent.name.endswith(".partial"):
            continue
        name, _, _ = manifest.parent.name.rpartition("-")  # <name>-<recipe hash>
        if name:
            names.add(name)
    found = []
    for name in sorted(names):
        try:
            found.append(find_image(name, root))
        except (ImageMissing, OSError, ValueError):
            continue  # a manifest that cannot be read is no image to offer
    return found


def _warm_slots(config: VmdConfig, image_dir_name: str) -> int:
    """Ready slots of one image across the state dir's pools (`warm`, `warm-<host>`), saved
    or parked (vmd/machines/parked_slot.py)."""
    return sum(len(ready_slots_in(pool / image_dir_name)) + len(parked_slots_in(pool / image_dir_name))
               for pool in config.state_dir.glob("warm*"))


def _memory_mib() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)
    except (ValueError, OSError):
        return 0


# Served without a session: verb -> handler(sessions, params) -> dict (handlers/table.py).
SESSIONLESS = {"host_info": host_info}
