"""Benchmark of a verified finish: where vmd runs the check, measured side by side in one run.

    .venv/bin/python bench/finish.py [--runs 2]

Each sample is one session on a real guest of the default image (vmd in this process, the
agent's side through vmagent's client): a project with a module and its unit test, one
task done, then `finish` with `python3 -m unittest`, timed from the call to its answer.
Three kinds, alternated within each round so that the machine's noise hits them alike:

- **session**: `verification.in = "session"`, the check run in the session's own guest
  (what vmd did before issue 35; weaker, never proven);
- **template**: the candidate and its baseline on two clean rooms restored from the
  room templates (vmd/machines/room_templates.py), made before the timing starts, the
  baseline's room booting while the candidate's check runs;
- **parked**: the same two clean rooms, each a room parked ahead from the room templates
  (vmd/machines/parked_rooms.py: restored, woken and paused before the finish; taken by a
  resume and the commit moved in), on a vmd of its own with its own templates; the timing
  starts once both rooms are parked, and the next sample waits for the refill;
- **cold**: the same two clean rooms, each booted cold (`VMD_ROOM_TEMPLATES=0`).

Prints each kind's median and its ratio to the session's, each room's own cost, and what
making the templates cost the first finish.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from vmagent.link import Vmd
from vmd.config import VmdConfig
from vmd.machines.images import find_image
from vmd.machines.libvirt_machines import LibvirtMachines
from vmd.server.rpc import VmdServer

P = "/mnt/project"
FILES = {"calc.py": "def add(a, b):\n    return a + b\n",
         "test_calc.py": "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
                         "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"}
CHECK = "python3 -m unittest -q test_calc"


def server(root: Path, name: str, templates: int, parked: int = 0) -> tuple[VmdServer, Path]:
    folder = root / name
    folder.mkdir(mode=0o711)
    socket = Path(tempfile.mkdtemp(prefix="vmd-bench-", dir="/tmp")) / "vmd.sock"
    config = VmdConfig.load(env={}, socket=socket, state_dir=folder / "state",
                            images_dir=find_image("debian").dir.parent, warm_pool_size=0,
                            room_templates=templates, room_parked=parked,
                            # the parked vmd's templates are its own: its parked rooms hold them
                            room_templates_dir=root / ("templates-parked" if parked else "templates"),
                            boot_timeout_s=900, verify_timeout_s=300)
    return VmdServer(config, LibvirtMachines(config)).start(), socket


def wait_parked(vmd: VmdServer, count: int = 2, within: float = 900) -> None:
    """Until `count` rooms of the default image are parked (the refill's work, untimed)."""
    machines = vmd.sessions.machines
    rooms = machines.parked_rooms[machines.host().name]
    image = find_image("debian", machines.config.images_dir)
    deadline = time.monotonic() + within
    while rooms.parked(image) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {rooms.parked(image)} room(s) parked in {within:.0f} s")
        time.sleep(1)


def one_finish(socket: Path, project: str, where: str | None, before=None) -> tuple[float, dict]:
    c = Vmd(str(socket), timeout=1800).connect()
    try:
        c.call("session_open", os="debian", project=project, task="add two numbers")
        c.call("plan_tasks", tasks=["write it"])
        c.call("session_ready", timeout=900)
        for path, text in FILES.items():
            c.call("write_file", path=f"{P}/{path}", content=text)
        c.call("update_task", id=1, status="done")
        c.call("run", command=f"cd {P} && {CHECK}", timeout=300)
        if before is not None:
            before()
        verification = {"command": CHECK, **({"in": where} if where else {})}
        started = time.monotonic()
        finished = c.call("finish", summary="adds", verification=verification)
        took = time.monotonic() - started
        outcome = finished.model_dump()["outcome"]
        # Each sample as it comes (stderr): a run cut short still says what it measured.
        rooms = [(r["role"], r["came"], r["seconds"]) for r in outcome.get("rooms", [])]
        print(f"{project}: {took:.1f} s, rooms {rooms}", file=sys.stderr, flush=True)
        assert outcome["passed"], finished
        c.call("session_close")
        return took, outcome
    finally:
        c.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vmd-bench-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o711)  # QEMU's user passes through to the overlays and projects
        templated, templated_socket = server(root, "templated", 2)
        parked, parked_socket = server(root, "parked", 2, parked=2)
        cold, cold_socket = server(root, "cold", 0)
        try:
            making, _ = one_finish(templated_socket, "first", None)
            one_finish(parked_socket, "first", None)  # its own templates (its rooms hold them while parked)
            samples: dict[str, list[float]] = {"session": [], "template": [], "parked": [], "cold": []}
            room_seconds: dict[str, list[float]] = {}  # each template or parked room's own cost, by kind and role
            for n in range(args.runs):
                samples["session"].append(one_finish(templated_socket, f"s{n}", "session")[0])
                for kind, socket in (("template", templated_socket), ("parked", parked_socket)):
                    took, outcome = one_finish(socket, f"{kind[0]}{n}", None,
                                               before=(lambda: wait_parked(parked)) if kind == "parked" else None)
                    assert [r["came"] for r in outcome.get("rooms", [])] in ([], [kind, kind]), outcome
                    samples[kind].append(took)
                    for room in outcome.get("rooms", []):
                        room_seconds.setdefault(f"{kind} finish, the {room['role']}", []).append(room["seconds"])
                wait_parked(parked)  # the refill's restores and wakes are done before the next timing
                samples["cold"].append(one_finish(cold_socket, f"c{n}", None)[0])
        finally:
            templated.stop()
            parked.stop()
            cold.stop()
    base = statistics.median(samples["session"])
    print(f"a verified finish (candidate + baseline), {args.runs} run(s) each, median s:")
    for kind, values in samples.items():
        median = statistics.median(values)
        print(f"  {kind:9s} {median:6.1f} s   x{median / base:5.2f} of the session's   "
              f"({', '.join(f'{v:.1f}' for v in values)})")
    for role, values in room_seconds.items():
        print(f"  of a {role} room's own cost (laid out, restored or resumed, run, gone): "
              f"{statistics.median(values):.1f} s")
    print(f"  the first finish, which made the templates: {making:.1f} s")


if __name__ == "__main__":
    main()
