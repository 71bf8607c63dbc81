"""`vmagent eval` against a real vmd (stand-in machines: commands run on this host in the
project folder) and the scripted Ollama server: a run that solves a task scores it solved,
one whose own check proves nothing is not solved-and-proven, one that stalls is failed
with its reason; the hidden check comes after the model's last turn and never reaches it;
results.json and index.html carry the figures; every task of evals/ loads."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support.loop_harness import agent_config, call, calls, running_vmd
from tests.support.eval_player import Player, tasks_without_a_desktop
from tests.support.ollama_server import start_ollama
from vmagent.eval.pages import read_results, write_results
from vmagent.eval.runner import Interrupted, run_all
from vmagent.eval.scores import row_of, table, totals_of
from vmagent.eval.tasks import EvalTaskError, load_task, load_tasks

EVALS = Path(__file__).resolve().parents[3] / "evals"
BUGGY = "def greet(name):\n    return 'hallo ' + name\n"
FIXED = "def greet(name):\n    return 'hello ' + name\n"
# The hidden check: a test file the agent never sees, run in the project folder; the
# project's code runs in a child (vmdcheck.values), and a pass writes vmd's nonce back.
CHECK = ("import os, sys\nsys.path.insert(0, os.environ['CHECK_DIR'])\nimport vmdcheck\n"
         "got = vmdcheck.values('greet', [('greet', ['ann'])])\n"
         "assert got == [{'value': 'hello ann'}], got\nvmdcheck.solved('hidden check ok')\n")
SECRET = "hidden check ok"


def make_task(root: Path, name: str = "greet", **toml: str) -> Path:
    folder = root / name
    (folder / "project").mkdir(parents=True)
    (folder / "check").mkdir()
    (folder / "project" / "greet.py").write_text(BUGGY)
    (folder / "check" / "check_greet.py").write_text(CHECK)
    (folder / "task.md").write_text("greet.py says hallo; make greet('ann') return 'hello ann'.\n")
    lines = {"kind": '"fix-failing-test"', "check": "'/usr/bin/python3 -I \"$CHECK_DIR/check_greet.py\"'", **toml}
    (folder / "task.toml").write_text("".join(f"{k} = {v}\n" for k, v in lines.items()))
    return folder


def solving_script(*verifications: str) -> list:
    return [
        call("plan_tasks", {"tasks": ["fix greet"]}, content="Planning."),
        calls(("update_task", {"id": 1, "status": "in_progress"}),
              ("write_file", {"path": "greet.py", "content": FIXED})),
        call("run", {"command": "python3 -c 'import greet; print(greet.greet(\"ann\"))'"}),
        call("update_task", {"id": 1, "status": "done", "note": "prints hello ann"}),
        *[call("finish", {"summary": "fixed", "verification": {"command": v}}) for v in verifications],
    ]


def run_eval(tmp_path, vmd, server, tasks_dir, **kw):
    out = tmp_path / "out"
    runs = run_all(load_tasks(tasks_dir), repeat=kw.pop("repeat", 1), concurrency=1, out_dir=out,
                   config=agent_config(server, **kw), socket=vmd.socket)
    rows = [row_of(run, out) for run in runs]
    return out, runs, rows


def test_a_run_that_solves_the_task_scores_solved_and_proven(tmp_path):
    tasks = tmp_path / "tasks"
    make_task(tasks)
    proof = "python3 -c 'import greet; assert greet.greet(\"x\") == \"hello x\"'"
    with running_vmd(tmp_path) as vmd, start_ollama(solving_script(proof)) as server:
        out, runs, rows = run_eval(tmp_path, vmd, server, tasks)
        record = vmd.record(runs[0].outcome.session_id)
        project = vmd.project(runs[0].project, owner="eval")
        requests = [json.dumps(body) for body in server.chat_requests]
    [row] = rows
    assert (row.outcome, row.hidden, row.check, row.solved, row.proven, row.expected) == (
        "done", "passed", "verified and proven", True, True, True), row
    assert row.turns == 5 and row.prompt_tokens > 0 and row.reply_tokens > 0 and row.model_s >= 0
    # Where vmd ran the hidden check is in the row and the table: a fresh machine, never the agent's.
    assert row.hidden_on == "fresh machine", row
    assert "fresh machine" in table(rows, totals_of(rows), "qwen3:32b")
    # The starting project was vmd's first commit, so the agent's check was proven against it.
    assert (project / "greet.py").read_text() == FIXED and not (project / "check_greet.py").exists()
    # vmd ran the hidden check after the finish and before the close, in the record.
    kinds = [(e["kind"], e.get("verb")) for e in record]
    finish, hidden, close = (kinds.index(("verb", "finish")), kinds.index(("verb", "hidden_check")),
                             kinds.index(("close", None)))
    assert finish < hidden < close
    # The model never saw the check: not its file, not its command, not its output.
    assert not any("check_greet" in body or SECRET in body for body in requests)
    totals = totals_of(rows)
    assert (totals.solved, totals.solved_and_proven, totals.tokens_per_solved) == (
        1, 1, row.prompt_tokens + row.reply_tokens)


def test_a_check_that_proves_nothing_is_solved_but_not_solved_and_proven(tmp_path):
    tasks = tmp_path / "tasks"
    make_task(tasks)
    # `true` passes on the project as it was: vmd refuses it once, then ends passed-not-proven.
    with running_vmd(tmp_path) as vmd, start_ollama(solving_script("true", "true")) as server:
        out, runs, rows = run_eval(tmp_path, vmd, server, tasks)
    [row] = rows
    assert (row.outcome, row.hidden, row.check, row.solved, row.proven) == (
        "done", "passed", "passed, not proven", True, False), row
    totals = totals_of(rows)
    assert (totals.solved, totals.solved_and_proven, totals.passed_not_proven) == (1, 0, 1)
    assert "passed, not proven" in table(rows, totals, "qwen3:32b")


def test_a_task_expected_to_end_not_proven_counts_as_expected_when_it_does(tmp_path):
    tasks = tmp_path / "tasks"
    make_task(tasks, expect_proven="false")
    with running_vmd(tmp_path) as vmd, start_ollama(solving_script("true", "true")) as server:
        _, _, rows = run_eval(tmp_path, vmd, server, tasks)
    assert rows[0].expected and not rows[0].proven


def test_a_run_that_stalls_is_failed_with_its_reason_and_the_hidden_check_fails(tmp_path):
    tasks = tmp_path / "tasks"
    make_task(tasks)
    script = [call("plan_tasks", {"tasks": ["fix greet"]})]
    with running_vmd(tmp_path) as vmd, start_ollama(script, default=call("run", {"command": "ls"})) as server:
        out, runs, rows = run_eval(tmp_path, vmd, server, tasks)
    [row] = rows
    assert row.outcome == "failed" and not row.solved and row.hidden == "failed", row
    assert row.reason and "hallo ann" in row.hidden_detail, row  # the loop's reason; the check's own output
    assert row.check == "not verified"
    text = table(rows, totals_of(rows), "qwen3:32b")
    assert row.reason[:40] in " ".join(text.split())


def test_results_json_and_the_page_carry_the_figures(tmp_path):
    tasks = tmp_path / "tasks"
    make_task(tasks, name="greet")
    make_task(tasks, name="greet-two")
    proof = "python3 -c 'import greet; assert greet.greet(\"x\") == \"hello x\"'"
    with running_vmd(tmp_path) as vmd, start_ollama(solving_script(proof) + solving_script("true", "true")) as server:
        out, runs, rows = run_eval(tmp_path, vmd, server, tasks)
    totals = totals_of(rows)
    json_path, html_path = write_results(out, rows, totals, {"model": "qwen3:32b", "started": "now"})
    data = read_results(out)
    assert [r["task"] for r in data["runs"]] == ["greet", "greet-two"]
    assert data["totals"]["solved"] == 2 and data["totals"]["solved_and_proven"] == 1
    assert data["runs"][0]["prompt_tokens"] == rows[0].prompt_tokens > 0
    page = html_path.read_text()
    assert page.count("<tr>") == 3 and "passed, not proven" in page and "solved and proven:" in page
    for row in rows:
        assert f'href="{row.report}"' in page and (out / row.report).read_text().startswith("# vmagent session")
        assert f'<td class="n">{row.prompt_tokens}</td>' in page


def test_a_question_is_answered_from_the_task_folder(tmp_path):
    tasks = tmp_path / "tasks"
    folder = make_task(tasks, kind='"needs-answer"')
    (folder / "answer.md").write_text("Use 'hello'.\n")
    proof = "python3 -c 'import greet; assert greet.greet(\"x\") == \"hello x\"'"
    script = solving_script(proof)
    script.insert(1, call("ask_user", {"question": "hello or hi?"}))
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        _, runs, rows = run_eval(tmp_path, vmd, server, tasks)
        answered = [json.dumps(body) for body in server.chat_requests]
    assert rows[0].solved and rows[0].answers == 1 and rows[0].outcome == "done", rows[0]
    assert any("Use 'hello'." in body for body in answered)


def test_a_broken_task_folder_is_refused_with_what_to_fix(tmp_path):
    folder = make_task(tmp_path, kind='"needs-answer"')
    with pytest.raises(EvalTaskError, match="needs answer.md"):
        load_task(folder)
    (folder / "task.toml").write_text('kind = "nonsense"\ncheck = "true"\n')
    with pytest.raises(EvalTaskError, match="kind"):
        load_task(folder)
    with pytest.raises(EvalTaskError, match="no eval task named nope"):
        load_tasks(tmp_path, ["nope"])


def test_every_task_in_evals_loads_and_the_set_covers_the_issues_kinds():
    tasks = load_tasks(EVALS)
    assert len(tasks) >= 20
    kinds = {t.meta.kind for t in tasks}
    assert {"cli-with-tests", "fix-failing-test", "c-make", "python-package", "log-summary", "gui",
            "needs-answer", "check-proves-nothing", "long-compaction"} <= kinds
    assert any(not t.meta.expect_proven for t in tasks)
    for task in tasks:
        # The hidden check is not in the starting project the agent gets.
        assert not set(task.check_files) & {Path(p).name for p in task.project_files}, task.name


def _check_here(task, with_solution: bool, tmp_path: Path) -> int:
    """The task's hidden check run on this host (Debian's python3, gcc and make, as in the
    guest) against its starting project, with or without its reference solution."""
    project, check = tmp_path / "project", tmp_path / "check"
    for rel, text in task.project_files.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    project.mkdir(parents=True, exist_ok=True)
    check.mkdir()
    for name, text in task.hidden_check().files.items():  # with vmdcheck.py, as vmd gets them
        (check / name).write_text(text)
    (check / ".nonce").write_text("n0nce")
    solution = task.folder / "solution"
    if with_solution and solution.is_dir():
        for path in (p for p in solution.rglob("*") if p.is_file()):
            (project / path.relative_to(solution)).parent.mkdir(parents=True, exist_ok=True)
            (project / path.relative_to(solution)).write_bytes(path.read_bytes())
    result = subprocess.run(["bash", "-c", f"export CHECK_DIR='{check}' CHECK_RESULT='{check}/.result'; "
                             f"{task.meta.check}"], cwd=project,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, capture_output=True, text=True,
                            timeout=600)
    # As vmd reads it: an exit without vmd's nonce written back is no pass (99: never expected).
    wrote = (check / ".result").is_file() and (check / ".result").read_text() == "n0nce"
    assert not (check / ".nonce").exists(), f"{task.name}: the check left the nonce where the project could read it"
    return result.returncode if wrote or result.returncode != task.meta.expect_exit else 99


@pytest.mark.parametrize("task", [t for t in load_tasks(EVALS) if t.meta.kind != "gui"], ids=lambda t: t.name)
def test_each_hidden_check_fails_on_the_start_and_passes_on_the_reference_solution(task, tmp_path):
    # The GUI task's check clicks a window on the guest's desktop: it needs X, which this host has not.
    # A task with nothing to change (verify-tests-only) needs no solution: the start is it.
    assert (task.folder / "solution").is_dir() or not task.meta.expect_proven, f"{task.name} has no solution"
    before = _check_here(task, False, tmp_path / "before")
    after = _check_here(task, True, tmp_path / "after")
    assert after == task.meta.expect_exit, f"{task.name}: the reference solution fails its hidden check"
    if task.meta.expect_proven:
        assert before != task.meta.expect_exit, f"{task.name}: the hidden check passes with no work done"


def test_the_whole_task_set_played_from_its_reference_solutions_scores_as_each_task_expects(tmp_path, monkeypatch):
    # Every task of evals/ through the normal path at two at once: its starting project
    # committed by vmd, the job, a question answered from answer.md, the hidden check by vmd.
    # The stand-in machine runs commands here: Debian's python3 first, as in the guest (a
    # newer pip refuses --no-use-pep517 without `wheel`, which the guest's pip 23.0 allows).
    monkeypatch.setenv("PATH", "/usr/bin:/bin:" + os.environ.get("PATH", ""))
    tasks = tasks_without_a_desktop(load_tasks(EVALS))
    with running_vmd(tmp_path) as vmd, start_ollama([], default=Player(tasks)) as server:
        out = tmp_path / "out"
        runs = run_all(tasks, repeat=1, concurrency=2, out_dir=out, config=agent_config(server), socket=vmd.socket)
    rows = {row.task: row for row in (row_of(run, out) for run in runs)}
    assert {name: (r.outcome, r.hidden) for name, r in rows.items() if not r.solved} == {}
    assert rows["verify-tests-only"].check == "passed, not proven" and rows["verify-tests-only"].expected
    assert rows["add-flag-tests-pass-already"].check == "verified and proven"  # after vmd refused the old tests as proof
    assert rows["ask-server-port"].answers == 1 and rows["ask-greeting-language"].answers == 1
    assert all(r.expected for r in rows.values()), [n for n, r in rows.items() if not r.expected]
    totals = totals_of(list(rows.values()))
    assert (totals.solved, totals.solved_and_proven) == (len(tasks), len(tasks) - 1)


def test_vmagent_eval_prints_the_table_and_keeps_json_and_page(tmp_path, monkeypatch, capsys):
    from vmagent import cli

    tasks = tmp_path / "tasks"
    make_task(tasks)
    for name in [k for k in os.environ if k.startswith(("VMAGENT_", "VMD_"))]:
        monkeypatch.delenv(name)
    proof = "python3 -c 'import greet; assert greet.greet(\"x\") == \"hello x\"'"
    with running_vmd(tmp_path) as vmd, start_ollama(solving_script(proof)) as server:
        monkeypatch.setenv("VMD_SOCKET", vmd.socket)
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        monkeypatch.setenv("VMAGENT_MODEL", "qwen3:32b")
        code = cli.main(["eval", "--tasks", str(tasks), "--out", str(tmp_path / "out")])
    shown = capsys.readouterr().out
    assert code == 0, shown
    assert "vmagent eval: qwen3:32b, 1 run" in shown and "solved and proven:            1/1 (100%)" in shown
    assert read_results(tmp_path / "out")["totals"]["solved"] == 1
    assert (tmp_path / "out" / "index.html").read_text().count("<tr>") == 2


def test_vmagent_eval_with_a_broken_task_set_runs_nothing_and_says_why(tmp_path, capsys):
    from vmagent import cli

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "task.toml").write_text('kind = "c-make"\n')
    assert cli.main(["eval", "--tasks", str(tmp_path)]) == 2
    assert "task.toml does not fit the format: check: Field required" in capsys.readouterr().err


def test_ctrl_c_cancels_the_jobs_in_flight_which_close_and_are_scored(tmp_path):
    # A real SIGINT, sent when the job's first command runs, to the job's own thread: a
    # terminal's Ctrl-C goes to the process, and the kernel may hand it to any thread. The
    # main thread, waiting on the pool, still gets KeyboardInterrupt at once; it got it only
    # once the run had ended, and the next round had begun (a CI run), when it waited on
    # the run in one long wait.
    tasks = tmp_path / "tasks"
    make_task(tasks)
    sent = []

    def on_event(task: str, event: dict) -> None:
        if event.get("type") == "command" and not sent:
            assert threading.current_thread() is not threading.main_thread()
            sent.append(task)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    script = [call("plan_tasks", {"tasks": ["fix greet"]})]
    # As at a terminal, even where pytest was started in the background (SIGINT ignored).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with running_vmd(tmp_path) as vmd, start_ollama(script, default=call("run", {"command": "sleep 0.3"})) as server:
            with pytest.raises(Interrupted) as stop:
                run_all(load_tasks(tasks), repeat=3, concurrency=1, out_dir=tmp_path / "out",
                        config=agent_config(server), socket=vmd.socket, on_event=on_event)
            [run] = stop.value.runs  # the two rounds not started never start
            record = vmd.record(run.outcome.session_id)
    finally:
        signal.signal(signal.SIGINT, before)
    assert run.outcome.state == "cancelled" and sent == ["greet"]
    assert any(e["kind"] == "close" for e in record), "the cancelled job closed its session"


# The check runs Debian's python3 first, as in the guest (Tk from python3-tk, setup.sh).
DEBIAN_PATH = "/usr/bin:/bin:" + os.environ.get("PATH", "")


def _gui_check_missing() -> str:
    if not (shutil.which("Xvfb") and shutil.which("xdotool")):
        return "the GUI check needs Xvfb and xdotool here (apt-get install xvfb xdotool)"
    if subprocess.run(["python3", "-c", "import tkinter"], capture_output=True,
                      env={**os.environ, "PATH": DEBIAN_PATH}).returncode != 0:
        return "the GUI check needs python3 with Tk here (apt-get install python3-tk)"
    return ""


def test_the_gui_tasks_check_clicks_the_button_and_reads_the_file_it_writes(tmp_path):
    if missing := _gui_check_missing():  # setup.sh installs all of it: CI runs this test
        pytest.fail(missing) if os.environ.get("CI") else pytest.skip(missing)
    # The Debian guest's desktop is X with openbox; Xvfb without a window manager stands in.
    task = next(t for t in load_tasks(EVALS) if t.meta.kind == "gui")
    display = f":{90 + os.getpid() % 9}"
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "1024x768x24"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.5)
        check = tmp_path / "check"
        check.mkdir()
        for name, text in task.hidden_check().files.items():
            (check / name).write_text(text)

        def clicked(clicker: str) -> subprocess.CompletedProcess:
            project = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
            project.mkdir()
            (project / "clicker.py").write_text(clicker)
            return subprocess.run(["bash", "-c", task.meta.check], cwd=project, capture_output=True, text=True,
                                  timeout=120, env={**os.environ, "PATH": DEBIAN_PATH, "DISPLAY": display,
                                                                         "CHECK_DIR": str(check)})

        solution = (task.folder / "solution" / "clicker.py").read_text()
        # A window the agent left open, started from another folder, is not the one clicked.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "clicker.py").write_text(solution)
        left_open = subprocess.Popen(["python3", "clicker.py"], cwd=elsewhere,
                                     env={**os.environ, "PATH": DEBIAN_PATH, "DISPLAY": display})
        try:
            time.sleep(1.5)
            assert clicked(solution).returncode == 0
            assert not (elsewhere / "clicked.txt").exists()
        finally:
            left_open.terminate()
        dead_button = solution.replace("command=save", "command=lambda: None")
        answer = clicked(dead_button)
        assert answer.returncode == 1 and "not written by the click" in answer.stdout
    finally:
        xvfb.terminate()
        xvfb.wait(10)
