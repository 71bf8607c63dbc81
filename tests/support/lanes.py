"""Two lanes for the suite under pytest-xdist (`pytest -n 2`, the README's test command).

The guest lane holds every module with a test that boots a real guest (`vm`, `compose`, `fleet`)
or that uses this host's guest-side plumbing (the egress guard's one nftables table): its
tests run one after another on one worker, as they would without xdist. Every other test
runs on the other worker, beside them. Guests under TCG are CPU-bound while they boot and
mostly idle while a test drives them, so the rest of the suite fills the gaps instead of
waiting for the guests.

The guest lane alone ran 51 minutes in CI while the other lane was done after 22, its
worker then idle. So the guest modules are two scopes: the first starts at once on one
worker; the second (`LATE_GUEST_MODULES`, ~14 minutes of guests) is queued behind every
other test, and the other worker takes it when it has run them, so from then on two guests
run at once, one per core. The late modules are ones that share nothing with the first
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
# About 14 minutes of guests in CI (agent faults ~8, eval ~4, the Ray cluster ~2.5), and the
# compose fleet (four guests in its hosts' containers; its bounds are outcomes too).
LATE_GUEST_MODULES = ("test_agent_faults_vm.py", "test_eval_vm.py", "test_ray_cluster_vm.py",
                      "test_fleet_stack.py")
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
        return LATE_GUEST_LANE if module in LATE_GUEST_MODULES else GUEST_LANE

    def _assign_work_unit(self, node) -> None:
        # The queue is complete (ordered by size) before the first unit goes out.
        if not self._late_queued_last and LATE_GUEST_LANE in self.workqueue:
            self.workqueue.move_to_end(LATE_GUEST_LANE)
        self._late_queued_last = True
        super()._assign_work_unit(node)
