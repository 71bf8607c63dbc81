"""The egress guard watched while guests have egress: it fails closed, not open.

The guard (vmd/machines/egress_guard.py) was checked when egress was approved and at a
boot with egress, and nothing checked it after: a firewall reload (Debian's
/etc/nftables.conf begins with `flush ruleset`) left every guest with egress reaching the
host's loopback and networks again, with nothing said. This watch asks every
`guard_watch_s` (2 s) while some guest has egress. When the table is gone or stale, every
such guest's egress link goes down at once (QMP set_link: the NIC stays, nothing of the
guest's is needed), each session's record says so, and vmd puts the table back; once it
holds again the links come up and the records say that too. A guard that cannot be put
back leaves the links down, and the watch tries again each round.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("vmd.server.guard_watch")


@dataclass
class Target:
    """One guest with egress open: its name, its machine (cut_egress), and its record."""
    name: str
    machine: object
    note: Callable[..., None]  # note(event, **fields): the session's record


class GuardWatch:
    def __init__(self, targets: Callable[[], list[Target]], problem: Callable[[], str | None],
                 reinstall: Callable[[], None], interval_s: float = 2.0):
        self.targets, self.problem, self.reinstall = targets, problem, reinstall
        self.interval_s = interval_s
        self.cut: dict[str, Target] = {}  # the guests whose egress this watch took down
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "GuardWatch":
        self._thread = threading.Thread(target=self._loop, daemon=True, name="vmd-guard-watch")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # the watch must outlive any one failure
                log.exception("the egress guard watch's round failed")

    def tick(self) -> None:
        targets = {t.name: t for t in self.targets()}
        for name in [n for n in self.cut if n not in targets]:
            del self.cut[name]  # closed, or its egress closed: nothing to restore
        if not targets:
            return
        problem = self.problem()
        if problem is None:
            self._restore(targets)
            return
        for name, target in targets.items():
            if name in self.cut:
                continue
            try:
                target.machine.cut_egress(True)
            except Exception as exc:  # a guest that cannot be cut is logged, the others still are
                log.error("egress guard gone, and %s's egress could not be cut: %s", name, exc)
                continue
            self.cut[name] = target
            target.note("egress_cut", reason=problem)
            log.warning("egress guard gone (%s): %s's egress cut", problem, name)
        try:
            self.reinstall()
        except Exception as exc:
            log.error("the egress guard could not be put back: %s; egress stays cut", exc)
            return
        if self.problem() is None:
            self._restore(targets)

    def _restore(self, targets: dict[str, Target]) -> None:
        for name in list(self.cut):
            target = targets.get(name)
            if target is None:
                continue
            try:
                target.machine.cut_egress(False)
            except Exception as exc:
                log.error("the egress guard is back, but %s's egress could not be restored: %s", name, exc)
                continue
            del self.cut[name]
            target.note("egress_restored")
