"""Two lanes for the suite under pytest-xdist (`pytest -n 2`, the README's test command).

The guest lane holds every module with a test that boots a real guest (`vm`, `compose`, `fleet`)
or that uses this host's guest-side plumbing (the egress guard's one nftables table): its
tests run one after another on one worker, as they would without xdist. Every other test
runs on the other worker, beside them. Guests under TCG are CPU-bound while they boot and
mostly idle while a test drives them, so the rest of the suite fills the gaps instead of
waiting for the guests.

The guest lane alone ran 51 minutes in CI while the other lane was done after 22, its
worker then idle. So the guest lane starts at once on one worker, and the late guest modules
(`LATE_GUEST_MODULES`, ~21 minutes of guests), a scope each, are queued behind every other
test: the worker that is free first takes the next, so from then on two guests run at once,
one per core, and neither worker waits long for the other at the end. The late modules are ones that share nothing with the first
scope's (not the egress guard's table, not a timed warm pool) and whose bounds are turns
and outcomes, not seconds.

Modules, not tests, are the unit: a module's fixtures (one booted guest, one Open WebUI)
serve all its tests on one worker. pytest-xdist's own `--dist loadgroup` would name groups
by marks, but it renames node ids to do so, which pytest 9 no longer lets it do; the
scheduler here reads the modules instead (the controller does not collect tests)."""

from __future__ import annotations

import re
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

GUEST_LANE = "guests"
LATE_GUEST_LANE = "guests, late"
# About 21 minutes of guests in CI: the compose fleet (four guests in its hosts' containers;
# its bounds are outcomes too) ~9.4, agent faults ~4.9, eval ~4.2, the Ray cluster ~2.9. Each is
# a scope of its own, queued in this order (the longest first): the worker free first takes
# the next. As one scope they all went to the worker that ran the other tests, and the guest
# lane's worker sat idle for the last 5.6 min of a CI rehearsal.
LATE_GUEST_MODULES = ("test_fleet_stack.py", "test_agent_faults_vm.py", "test_eval_vm.py",
                      "test_ray_cluster_vm.py")
# Modules in the guest lane although none of their tests boots a guest.
HOST_PLUMBING_MODULES = ("test_egress_guard.py",)
_GUEST_MARK = re.compile(r"\bmark\.(vm|compose|fleet)\b")


def guest_lane_modules(tests_dir: Path) -> set[str]:
    """The file names of the modules whose tests run in the guest lane. The modules live in
    folders that mirror the packages (tests/vmd/machines/, tests/e2e/, ...): every folder is
    read, and a module is known by its file name, which is unique across tests/."""
    names = set(HOST_PLUMBING_MODULES)
    for module in tests_dir.rglob("test_*.py"):
        if _GUEST_MARK.search(module.read_text(encoding="utf-8", errors="replace")):
            names.add(module.name)
    return names


class LaneScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling with three kinds of scope: the guest lane, the late
    guest lane, and each other test on its own. Scopes go out largest first, so the guest
    lane starts at once on one worker and the other tests spread over the rest; the late
    guest lane goes out last."""

    def __init__(self, config, log=None, modules: set[str] | None = None):
        super().__init__(config, log)
        self.modules = modules if modules is not None else guest_lane_modules(Path(__file__).parents[1])
        self._late_queued_last = False

    def _split_scope(self, nodeid: str) -> str:
        module = Path(nodeid.split("::", 1)[0]).name
        if module not in self.modules:
            return nodeid
        return late_scope(module) if module in LATE_GUEST_MODULES else GUEST_LANE

    def _assign_work_unit(self, node) -> None:
        # The queue is complete (ordered by size) before the first unit goes out.
        if not self._late_queued_last:
            for module in LATE_GUEST_MODULES:
                if late_scope(module) in self.workqueue:
                    self.workqueue.move_to_end(late_scope(module))
        self._late_queued_last = True
        super()._assign_work_unit(node)

    def _reschedule(self, node) -> None:
        # xdist gives a worker its next unit once it holds 2 tests or fewer, so a worker
        # would take each late module while two tests of the one before were still to run,
        # and hold them all before the other worker was free. A late module goes out only to
        # a worker on its last test (which it holds back until it knows the next: xdist's
        # worker waits for one more test, or the end, before it runs its last).
        if (self.workqueue and next(iter(self.workqueue)).startswith(LATE_GUEST_LANE)
                and self._pending_of(self.assigned_work[node]) > 1):
            return
        super()._reschedule(node)


def late_scope(module: str) -> str:
    """The scope of a late guest module: one module each."""
    return f"{LATE_GUEST_LANE}: {module}"
