"""The clean room's rules on the stand-in machine (the attacks on real guests are in
tests/e2e/test_clean_room_vm.py): which files are the check's own, what each room holds,
a room that cannot be had, a setup that fails, a session check, files changed after the
verified commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.vmd_fakes import LocalMachines, RpcClient, RpcError, make_config
from vmd.projects.repository import Repository
from vmd.server.rpc import VmdServer
from vmd.session.clean_room import lay_out
from vmd.session.verification import check_files


def test_the_checks_own_files_are_its_tests_the_named_ones_and_the_checks_the_command_runs():
    changed = ["A calc.py", "A test_calc.py", "M tests/helpers.py", "D test_old.py", "A check.sh",
               "A src/x_test.go", "A web/a.spec.ts", "A hello.py", "A lib/t.py"]
    assert check_files(changed, "python3 -m pytest -q", []) == [
        "test_calc.py", "tests/helpers.py", "src/x_test.go", "web/a.spec.ts"]
    # The command runs a check script (taken) and the program itself (the work: not taken).
    assert check_files(changed, "bash ./check.sh && python3 hello.py | grep -q hi", []) == [
        "test_calc.py", "tests/helpers.py", "check.sh", "src/x_test.go", "web/a.spec.ts"]
    # Named files are the check's whatever their names; then the command's are not guessed.
    assert check_files(changed, "bash check.sh", ["lib/t.py"]) == [
        "test_calc.py", "tests/helpers.py", "src/x_test.go", "web/a.spec.ts", "lib/t.py"]
    assert check_files(changed, "sh -c 'unbalanced", []) == [
        "test_calc.py", "tests/helpers.py", "src/x_test.go", "web/a.spec.ts"]


def _repo(tmp_path: Path) -> tuple[Repository, str, str]:
    bare = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    work = tmp_path / "w"
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    env = ["-c", "user.name=t", "-c", "user.email=t@t"]
    (work / "old.txt").write_text("old\n")
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(work), *env, "commit", "-qm", "base"], check=True)
    (work / "calc.py").write_text("work\n")
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(work), *env, "commit", "-qm", "work"], check=True)
    subprocess.run(["git", "-C", str(work), "push", "-q", str(bare), "main"], check=True)
    repo = Repository(bare)
    return repo, repo.git("rev-parse", "main~1").stdout.decode().strip(), repo.head()


def test_a_baseline_room_holds_the_old_tree_and_the_checks_files_and_nothing_of_the_work(tmp_path):
    repo, base, head = _repo(tmp_path)
    room = tmp_path / "base"
    lay_out(repo, base, room, {"test_calc.py": b"assert False\n"}, None)
    assert sorted(p.name for p in room.iterdir()) == [".git", "old.txt", "test_calc.py"]
    git = ["git", "-C", str(room)]
    assert subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout == ""
    # The work's commit is nowhere in the room's objects: no checkout, log or reflog brings it back.
    assert subprocess.run([*git, "cat-file", "-e", head], capture_output=True).returncode != 0
    assert not list(room.glob(".git/hooks/*"))
    # The candidate's room: the work as a git work tree, its history with it.
    cand = tmp_path / "cand"
    lay_out(repo, head, cand, {}, None)
    assert sorted(p.name for p in cand.iterdir()) == [".git", "calc.py", "old.txt"]
    assert subprocess.run([*git[:2], str(cand), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() == head
    assert not [r for r in repo.git("for-each-ref").stdout.decode().splitlines() if "refs/vmd/" in r]


@pytest.fixture
def vmd(tmp_path):
    machines = LocalMachines()
    config = make_config(tmp_path)
    server = VmdServer(config, machines).start()
    c = RpcClient(config.socket, timeout=60)
    c.machines, c.config = machines, config
    c.call("session_open", project="room", task="write app.sh")
    c.call("plan_tasks", tasks=["write it"])
    c.call("run", command="echo 'echo hi' > app.sh; printf '[ \"$(bash app.sh)\" = hi ]\\n' > check.sh")
    c.call("update_task", id=1, status="done")
    yield c
    c.close()
    server.stop()


def _refused(c, **params) -> RpcError:
    with pytest.raises(RpcError) as err:
        c.call("finish", **params)
    return err.value


def test_the_check_runs_in_two_fresh_machines_and_never_in_the_sessions(vmd):
    session_machine = next(iter(vmd.machines.machines))
    finished = vmd.call("finish", summary="hi", verification="bash check.sh")
    outcome = finished["outcome"]
    assert outcome["passed"] is True and outcome["proven"] is True and outcome["where"] == "clean_room"
    assert outcome["check_files"] == ["check.sh"] and [r["role"] for r in outcome["rooms"]] == ["check", "baseline"]
    rooms = [name for name in vmd.machines.machines if name != session_machine]
    assert len(rooms) == 2 and all(name in vmd.machines.destroyed for name in rooms)
    assert session_machine not in vmd.machines.destroyed
    # The rooms' folders are gone; the session's project folder is as the work left it.
    session_dir = vmd.config.sessions_dir / vmd.session_id
    assert not list((session_dir / "rooms").iterdir())


def test_no_fresh_machine_refuses_the_finish_and_counts_nothing(vmd):
    vmd.machines.fail = "no image here"
    refused = _refused(vmd, summary="hi", verification="bash check.sh")
    assert refused.message.startswith("REFUSED: the check could not run on a fresh machine: ")
    assert "no image here" in refused.message and "finish again" in refused.message
    assert vmd.call("session_status")["state"] == "ready"
    vmd.machines.fail = None
    assert vmd.call("finish", summary="hi", verification="bash check.sh")["outcome"]["attempts"] == 1


def test_a_failed_setup_is_said_as_such_and_a_session_check_is_never_proven(vmd):
    refused = _refused(vmd, summary="hi", verification={"command": "bash check.sh", "setup": "exit 7"})
    assert refused.message.startswith("REFUSED: the setup `exit 7` failed on the fresh machine (exit 7)")
    attempt = refused.data["attempt"]
    assert attempt["passed"] is False and attempt["setup"]["exit_code"] == 7
    finished = vmd.call("finish", summary="hi", verification={"command": "bash check.sh", "in": "session"})
    outcome = finished["outcome"]
    assert outcome["where"] == "session" and outcome["proven"] is None and outcome["baseline"] is None
    assert "checked in the session's own machine" in finished["text"]
    report = vmd.call("report")
    assert report["outcome"]["status"] == "passed_not_proven" and report["outcome"]["where"] == "session"


def test_files_changed_after_the_verified_commit_are_pushed_as_not_verified(vmd):
    finished = vmd.call("finish", summary="hi", verification="bash check.sh")
    candidate = finished["outcome"]["candidate"]
    vmd.call("run", command="echo later > later.txt")  # a process the model left behind, say
    closed = vmd.call("session_close")
    assert closed["changed_after"] == candidate and "NOT verified" in closed["text"]
    repo = vmd.config.state_dir / "repos" / "local" / "room.git"
    log = subprocess.run(["git", "--git-dir", str(repo), "log", "-2", "--format=%H %B", "main"],
                         capture_output=True, text=True, check=True).stdout
    assert "NOT verified by vmd" in log and candidate in log
    assert "**Not verified**" in vmd.call("report")["markdown"]


def test_an_unchanged_folder_pushes_the_verified_tree_as_verified(vmd):
    finished = vmd.call("finish", summary="hi", verification="bash check.sh")
    closed = vmd.call("session_close")
    assert closed["changed_after"] is None and "NOT verified" not in closed["text"]
    repo = vmd.config.state_dir / "repos" / "local" / "room.git"
    git = ["git", "--git-dir", str(repo)]
    tree = lambda rev: subprocess.run([*git, "rev-parse", f"{rev}^{{tree}}"], capture_output=True, text=True).stdout
    assert tree(closed["commit"]) == tree(finished["outcome"]["candidate"])
    message = subprocess.run([*git, "log", "-1", "--format=%B", "main"], capture_output=True, text=True).stdout
    assert "on a fresh machine holding" in message and "verified and proven" in message


def _slow_rooms(vmd, seconds: dict[str, float]) -> list[tuple[str, str, float]]:
    """Rooms whose boot takes `seconds[role]` ("check", "base"); each boot's start and end
    noted as (role, "start"|"end", monotonic time)."""
    import time

    noted: list[tuple[str, str, float]] = []
    create = vmd.machines.create

    def made(spec):
        machine = create(spec)
        role = next((r for r in seconds if f"-{r}-" in spec.name), None)
        if role is not None:
            def ready(timeout, desktop=False, _ready=machine.ready):
                noted.append((role, "start", time.monotonic()))
                time.sleep(seconds[role])
                facts = _ready(timeout, desktop)
                noted.append((role, "end", time.monotonic()))
                return facts
            machine.ready = ready
        return machine

    vmd.machines.create = made
    return noted


def test_the_baseline_room_boots_while_the_candidates_check_runs(vmd):
    noted = _slow_rooms(vmd, {"check": 1.0, "base": 1.0})
    outcome = vmd.call("finish", summary="hi", verification="bash check.sh")["outcome"]
    assert outcome["passed"] is True and outcome["proven"] is True
    when = {(role, edge): t for role, edge, t in noted}
    # Side by side: the baseline's boot began before the candidate's had ended.
    assert when[("base", "start")] < when[("check", "end")], noted


def test_a_failed_check_is_refused_without_waiting_for_the_baselines_boot_and_its_room_goes(vmd):
    import time

    noted = _slow_rooms(vmd, {"base": 3.0})
    vmd.call("run", command="echo 'echo bye' > app.sh")  # the work is wrong now
    refused = _refused(vmd, summary="hi", verification="bash check.sh")
    assert refused.message.startswith("REFUSED: your verification failed")
    base_ended = [t for role, edge, t in noted if (role, edge) == ("base", "end")]
    assert not base_ended, "the refusal waited for the baseline's boot, which it does not use"
    base = [name for name in vmd.machines.machines if "-base-" in name]
    assert len(base) == 1
    rooms = vmd.config.sessions_dir / vmd.session_id / "rooms"
    # The room's machine goes first, then its folder, in the background: wait for both (the
    # folder checked right after the machine's end was seen still there once, in CI).
    deadline = time.monotonic() + 30
    while (base[0] not in vmd.machines.destroyed or list(rooms.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert base[0] in vmd.machines.destroyed, "the unused baseline room was left running"
    assert not list(rooms.iterdir()), "the unused baseline room's folder was left behind"
    assert vmd.call("session_status")["state"] == "ready"
