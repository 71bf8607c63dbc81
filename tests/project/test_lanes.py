"""The suite's lanes under pytest-xdist (tests/support/lanes.py), driven as xdist's controller
drives a scheduler: two workers that collected the same tests, each finishing what it was
sent in order. What CI's wall time rests on: the guest lane starts at once on one worker,
the late guest lane goes to the other worker only after every other test."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.support.lanes import GUEST_LANE, LATE_GUEST_MODULES, LaneScheduling, late_scope

GUESTS = {"test_machine_vm.py", "test_egress_guard.py", *LATE_GUEST_MODULES}


class Worker:
    def __init__(self, name: str):
        self.name, self.sent, self.shutting_down = name, [], False
        self.gateway = SimpleNamespace(id=name)  # xdist names a worker by it in its log

    def send_runtest_some(self, indexes):
        self.sent.extend(indexes)

    def shutdown(self):
        self.shutting_down = True


def _config():
    values = {"tx": ["2*popen"], "dist": "load"}
    return SimpleNamespace(getvalue=values.__getitem__, option=SimpleNamespace(loadscopereorder=True))


def _scheduled(collection: list[str]) -> tuple[LaneScheduling, Worker, Worker]:
    """The scheduler after its first distribution to two workers, `a` and `b`."""
    sched = LaneScheduling(_config(), modules=GUESTS)
    a, b = Worker("a"), Worker("b")
    for w in (a, b):
        sched.add_node(w)
        sched.add_node_collection(w, collection)
    sched.schedule()
    return sched, a, b


def _run(collection: list[str]) -> dict[str, list[str]]:
    """Which tests each worker ran, in order, with worker `a` as slow as the guests make it:
    `b` finishes all it holds while `a` works through its first unit."""
    sched, a, b = _scheduled(collection)
    ran: dict[str, list[str]] = {"a": [], "b": []}
    done = {"a": 0, "b": 0}
    # b runs everything it is sent, one test at a time, until the queue is empty; then a.
    for worker in (b, a, b, a):
        while done[worker.name] < len(worker.sent):
            index = worker.sent[done[worker.name]]
            done[worker.name] += 1
            ran[worker.name].append(collection[index])
            sched.mark_test_complete(worker, index)
    return ran


def test_the_guest_lane_starts_first_and_the_late_one_after_every_other_test():
    collection = ([f"tests/e2e/test_agent_faults_vm.py::test_fault_{i}" for i in range(4)]
                  + [f"tests/vmagent/test_cli.py::test_{i}" for i in range(6)]
                  + ["tests/vmd/machines/test_egress_guard.py::test_table", "tests/e2e/test_eval_vm.py::test_two_tasks"]
                  + [f"tests/vmd/machines/test_machine_vm.py::test_{i}" for i in range(3)]
                  + ["tests/e2e/test_ray_cluster_vm.py::test_host_dies", "tests/test_zz_last.py::test_it"])
    ran = _run(collection)
    assert sorted(ran["a"] + ran["b"]) == sorted(collection), "every test runs once"
    first = [t for t in collection if t.split("::")[0].rsplit("/", 1)[1] in {"test_machine_vm.py", "test_egress_guard.py"}]
    late = [t for t in collection if t.split("::")[0].rsplit("/", 1)[1] in LATE_GUEST_MODULES]
    # The guest lane is worker a's first unit, whole and in collection order.
    assert ran["a"][:len(first)] == first
    # Worker b ran every other test before the late guest lane, then the late lane whole.
    others = [t for t in collection if t not in first and t not in late]
    b_others = [t for t in ran["b"] if t in others]
    assert ran["b"][-len(late):] == late, ran["b"]
    assert len(b_others) >= len(others) - 2, "a may hold the two tests it was sent ahead, no more"


def test_each_late_module_goes_to_the_worker_free_first_not_ahead_to_one_worker():
    # Worker a boots the guest lane's guests while b runs the other tests and starts on the
    # late modules; once a is done it takes the next late module. xdist's own rule would
    # have handed b every late module while it still had two tests to run of the one before.
    collection = ([f"tests/vmd/machines/test_machine_vm.py::test_{i}" for i in range(3)]
                  + [f"tests/vmagent/test_cli.py::test_{i}" for i in range(2)]
                  + [f"tests/e2e/test_fleet_stack.py::test_{i}" for i in range(3)]
                  + [f"tests/e2e/test_agent_faults_vm.py::test_{i}" for i in range(3)]
                  + ["tests/e2e/test_eval_vm.py::test_two_tasks", "tests/e2e/test_ray_cluster_vm.py::test_host_dies"])
    sched, a, b = _scheduled(collection)
    done = {"a": 0, "b": 0}

    def run(worker: Worker, count: int) -> None:
        for _ in range(count):
            index = worker.sent[done[worker.name]]
            done[worker.name] += 1
            sched.mark_test_complete(worker, index)

    def held(worker: Worker) -> set[str]:
        return {Path(collection[i].split("::")[0]).name for i in worker.sent[done[worker.name]:]}

    assert [collection[i] for i in a.sent[:3]] == collection[:3], "the guest lane starts at once on a"
    while "test_agent_faults_vm.py" not in held(b):
        run(b, 1)
    # b is on the fleet's last test: it holds the next late module, and only that one.
    assert held(b) == {"test_fleet_stack.py", "test_agent_faults_vm.py"}, held(b)
    run(a, 3)  # the guest lane is done: a takes the next late module (and, holding one test
    # back until it knows the next, the one after: the eval's module is a single test)
    assert "test_eval_vm.py" in held(a), held(a)
    for worker in (b, a, b):
        run(worker, len(worker.sent) - done[worker.name])
    ran = [collection[i] for w in (a, b) for i in w.sent]
    assert sorted(ran) == sorted(collection), "every test runs once"


def test_scopes_are_whole_modules_of_guests_and_single_tests_otherwise():
    sched = LaneScheduling(_config(), modules=GUESTS)
    assert sched._split_scope("tests/vmd/machines/test_machine_vm.py::test_ready") == GUEST_LANE
    assert sched._split_scope("tests/e2e/test_eval_vm.py::test_two_tasks[x]") == late_scope("test_eval_vm.py")
    assert sched._split_scope("tests/vmagent/test_cli.py::test_help") == "tests/vmagent/test_cli.py::test_help"


def test_the_guest_modules_are_found_in_every_folder_of_tests():
    # The modules live in folders that mirror the packages (tests/vmd/machines/, tests/e2e/):
    # a lane that read only tests/ itself would be empty, and under `-n 2` the guests would
    # boot on both workers at once, each beside the other's, with nothing failing to say so.
    tests_dir = Path(__file__).resolve().parents[1]
    found = LaneScheduling(_config()).modules
    assert {"test_machine_vm.py", "test_egress_guard.py", "test_session_vm.py", *LATE_GUEST_MODULES} <= found
    assert "test_cli.py" not in found and "test_lanes.py" not in found
    # A module is known by its file name alone: two of one name would share a lane.
    names = [p.name for p in tests_dir.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)
