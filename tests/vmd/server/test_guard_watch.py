"""The egress guard watched while guests have egress (vmd/server/guard_watch.py): a guard
that goes away cuts every such guest's egress within a round, each session's record says
so, and the links come back once the guard is put back; a guard that cannot be put back
leaves them cut. On a real guest and the real nftables table:
tests/vmd/machines/test_machine_vm.py::test_a_guard_flushed_while_a_guest_has_egress_cuts_it_until_it_is_back."""

from __future__ import annotations

import json
import time

from tests.support.vmd_fakes import LocalMachines, local_vmd
from tests.support.vmd_wire import WireVmd
from vmd.server.guard_watch import GuardWatch, Target


class Link:
    def __init__(self, fails: bool = False):
        self.cut, self.fails = False, fails

    def cut_egress(self, cut: bool) -> None:
        if self.fails:
            raise ConnectionError("QMP did not answer")
        self.cut = cut


def test_a_missing_guard_cuts_each_guest_once_and_restores_them_when_it_is_back():
    notes: list[tuple] = []
    guests = {name: Link() for name in ("s-a", "s-b")}
    broken = Link(fails=True)
    targets = [Target(n, m, lambda e, n=n, **kw: notes.append((n, e))) for n, m in guests.items()]
    targets.append(Target("s-broken", broken, lambda e, **kw: notes.append(("s-broken", e))))
    state = {"problem": "the egress guard is not installed", "reinstalls": 0, "can_install": False}

    def reinstall():
        state["reinstalls"] += 1
        if state["can_install"]:
            state["problem"] = None

    watch = GuardWatch(lambda: targets, lambda: state["problem"], reinstall)
    watch.tick()
    watch.tick()  # a guard that cannot be put back: still cut, noted once
    assert all(m.cut for m in guests.values()) and state["reinstalls"] == 2
    assert notes == [("s-a", "egress_cut"), ("s-b", "egress_cut")]  # the broken one is logged, not noted
    state["can_install"] = True
    watch.tick()
    assert not any(m.cut for m in guests.values()) and not watch.cut
    assert notes[2:] == [("s-a", "egress_restored"), ("s-b", "egress_restored")]


def test_no_guest_with_egress_costs_no_check():
    asked = []
    GuardWatch(lambda: [], lambda: asked.append(1), lambda: None).tick()
    assert asked == []


def _events(config, session_id: str) -> list[dict]:
    path = config.state_dir / "sessions" / session_id / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_session_with_egress_is_cut_while_the_guard_is_gone_and_goes_on(tmp_path):
    with local_vmd(tmp_path, LocalMachines()) as (server, machines, config):
        c = WireVmd(config.socket, timeout=60).connect()
        c.call("session_open", os="debian", project="guarded", task="t")
        c.call("plan_tasks", tasks=["one"])
        c.call("session_ready", timeout=30)
        c.call("request_unfreeze", reason="pip install")
        c.call("session_resume", approved=True)
        machine = machines.machines[f"vmagent-{c.session_id}"]
        assert machine.egress and not machine.egress_cut
        machines.guard_missing = "the egress guard is not installed"  # a firewall reload flushed it
        deadline = time.monotonic() + 3 * config.guard_watch_s + 5
        while not machine.egress_cut and time.monotonic() < deadline:
            time.sleep(0.1)
        assert machine.egress_cut, "the watch did not cut egress within its bound"
        assert machines.guard_installs >= 2  # vmd's start, then the watch putting it back
        assert c.call("run", command="echo still here")["stdout"].strip() == "still here"  # the session goes on
        machines.guard_missing = None

        def egress_events() -> list[dict]:
            return [e for e in _events(config, c.session_id) if e.get("kind") == "egress" or e.get("type") == "egress"]

        # Waited for by the record, not the machine's flag: the watch notes the restore just
        # after the link is up, and a read between the two (CI under load) saw no note yet.
        restored_by = time.monotonic() + 3 * config.guard_watch_s + 15
        while (machine.egress_cut or (egress_events() or [{}])[-1].get("event") != "egress_restored") \
                and time.monotonic() < restored_by:
            time.sleep(0.1)
        assert not machine.egress_cut
        events = egress_events()
        assert [e.get("event") for e in events][-2:] == ["egress_cut", "egress_restored"], events
        assert "not installed" in events[-2]["reason"]
        c.call("session_close")
