"""Two lanes for the suite under pytest-xdist (`pytest -n 2`, the README's test command).

The guest lane holds every module with a test that boots a real guest (`vm`, `compose`)
or that uses this host's guest-side plumbing (the egress guard's one nftables table): its
tests run one after another on one worker, as they would without xdist. Every other test
runs on the other worker, beside them. Guests under TCG are CPU-bound while they boot and
mostly idle while a test drives them, so the rest of the suite fills the gaps instead of
waiting for the guests.

Modules, not tests, are the unit: a module's fixtures (one booted guest, one Open WebUI)
serve all its tests on one worker. pytest-xdist's own `--dist loadgroup` would name groups
by marks, but it renames node ids to do so, which pytest 9 no longer lets it do; the
scheduler here reads the modules instead (the controller does not collect tests)."""

from __future__ import annotations

import re
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

GUEST_LANE = "guests"
# Modules in the guest lane although none of their tests boots a guest.
HOST_PLUMBING_MODULES = ("test_egress_guard.py",)
_GUEST_MARK = re.compile(r"\bmark\.(vm|compose)\b")


def guest_lane_modules(tests_dir: Path) -> set[str]:
    """The file names of the modules whose tests run in the guest lane."""
    names = set(HOST_PLUMBING_MODULES)
    for module in tests_dir.glob("test_*.py"):
        if _GUEST_MARK.search(module.read_text(encoding="utf-8", errors="replace")):
            names.add(module.name)
    return names


class LaneScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling with two kinds of scope: the whole guest lane, and
    each other test on its own. Scopes go out largest first, so the guest lane starts at
    once on one worker and the other tests spread over the rest."""

    def __init__(self, config, log=None, modules: set[str] | None = None):
        super().__init__(config, log)
        self.modules = modules if modules is not None else guest_lane_modules(Path(__file__).parent)

    def _split_scope(self, nodeid: str) -> str:
        module = Path(nodeid.split("::", 1)[0]).name
        return GUEST_LANE if module in self.modules else nodeid
