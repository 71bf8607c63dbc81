"""How much room this host has for guests: the warm pool's size for "auto" (cores and
memory) and whether a slot may be made now (load, memory available, free disk). Read from
this host's /proc and its disks, measured where vmd runs: `LocalRoom` is the local host's
`Room` (vmd/machines/host.py). The guest's memory is VmdConfig.guest_memory_mib, passed in."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LocalRoom:
    """The room of the machine vmd runs on (vmd/machines/host.py `Room`)."""

    def pool_size(self, guest_mib: int) -> int:
        return host_pool_size(None, None, guest_mib)

    def no_room(self, folder: Path, guest_mib: int) -> str | None:
        return no_room(folder, guest_mib=guest_mib)


def host_pool_size(cores: int | None, memory_mib: int | None, guest_mib: int) -> int:
    """The pool size "auto" means: one slot per two cores, since a slot's boot takes about
    a core for its length and the sessions need the rest; no more than a quarter of the
    host's memory in guests being made and restored at once; and at most 4, because past
    that the slots wait on disk for sessions a host of this size could not run together
    anyway. A 2-core host gets 1; a 1-core host none."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    memory_mib = memory_mib if memory_mib is not None else _meminfo_mib("MemTotal")
    by_memory = memory_mib // (4 * guest_mib) if memory_mib is not None else 4
    return max(0, min(4, cores // 2, by_memory))


def no_room(folder: Path, *, guest_mib: int) -> str | None:
    """Why the host has no room to make a slot now, or None.

    - Runnable work past twice the cores: a slot's boot now would slow the sessions'
      work. (An idle TCG guest alone keeps the load near 1 on a small host, so one
      core's worth would stop every refill while any session runs.)
    - Less memory available than two guests: the slot's guest would push the sessions'
      guests into swap.
    - Less free disk than the slot's saved memory and overlay plus 3 GiB: vmd's own
      records and the sessions' disks need it more (a full disk pauses their guests).
      Measured on `folder`'s nearest existing folder: before the first slot there is no
      pool folder yet, and the disk is the one it will be made on."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    if load > 2 * cores:
        return f"the host is busy (load {load:.1f} on {cores} cores)"
    available = _meminfo_mib("MemAvailable")
    if available is not None and available < 2 * guest_mib:
        return f"the host has {available} MiB of memory available, under two guests' {2 * guest_mib} MiB"
    existing = next((p for p in (folder, *folder.parents) if p.exists()), folder)
    try:
        free_mib = shutil.disk_usage(existing).free // 2**20
    except OSError:
        return None
    if free_mib < guest_mib + 3072:
        return f"the disk under {folder} has {free_mib} MiB free, under a slot's {guest_mib + 3072} MiB"
    return None


def _meminfo_mib(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
