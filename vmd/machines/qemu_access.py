"""What QEMU's unprivileged user must reach of a machine's folders (vmd/machines/machine.py):
every folder above what it opens passable, and the one folder it writes screen dumps to."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from vmd.machines.host import Host
from vmd.machines.port import MachineError


def check_reachable(path: Path, uid: int, gid: int, user: str) -> None:
    """QEMU runs unprivileged: every folder above what it opens must let it pass."""
    for folder in list(path.parents)[::-1] + ([path] if path.is_dir() else []):
        st = folder.stat()
        if ((st.st_uid == uid and st.st_mode & stat.S_IXUSR) or (st.st_gid == gid and st.st_mode & stat.S_IXGRP)
                or st.st_mode & stat.S_IXOTH):
            continue
        raise MachineError(f"QEMU runs as {user} and cannot pass through {folder} (mode "
                           f"{stat.S_IMODE(st.st_mode):o}) to reach {path}; make it traversable "
                           f"(chmod o+x {folder}) or move vmd's state and images dirs elsewhere.")


def make_screen_dir(host: Host, workdir: Path, run_as: tuple[int, int] | None) -> None:
    """The folder QEMU may write the guest's framebuffer to (`Host.screen_dir`); nothing
    else goes there."""
    screen_dir = host.screen_dir(workdir)
    if screen_dir is None:  # QEMU's files are not vmd's to read: screenshots come by libvirt
        return
    screen_dir.mkdir(mode=0o700, exist_ok=True)
    if run_as is not None:  # QEMU writes its screendumps here (vmd/machines/screen.py)
        os.chown(screen_dir, *run_as)
