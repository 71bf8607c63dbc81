"""The job service's read-only page of the last `vmagent eval` runs (vmagent/service/
eval_pages.py), over real HTTP from a real service process: the list with the totals,
each run's page and its reports as plain text, a token needed, nothing outside the
folder reachable."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.service_harness import BOB, ServiceProcess
from vmagent.eval.pages import write_results
from vmagent.eval.scores import Row, totals_of


def _row(task: str, solved: bool, check: str) -> Row:
    return Row(task=task, kind="c-make", round=1, outcome="done", reason="The agent finished and vmd accepted it.",
               check=check, hidden="passed" if solved else "failed", hidden_detail="exit 0", solved=solved,
               proven=check == "proven", expected=solved, turns=7, model_s=12.5, prompt_tokens=4100,
               reply_tokens=300, wall_s=40.0, answers=0, session_id="s-1", report=f"runs/{task}-1/report.md")


@pytest.fixture
def service(tmp_path):
    runs_dir = tmp_path / "eval-runs"
    for name, model, rows in (("older", "qwen3:8b", [_row("c-calc-make", False, "failed")]),
                              ("newer", "qwen3-vl:32b", [_row("c-calc-make", True, "proven"),
                                                         _row("fix-roman", True, "passed, not proven")])):
        out = runs_dir / name
        for row in rows:
            (out / row.report).parent.mkdir(parents=True)
            (out / row.report).write_text(f"# vmagent session\n\n<script>alert('{row.task}')</script>\n")
        write_results(out, rows, totals_of(rows), {"model": model, "started": name})
        time.sleep(0.05)  # the list is newest first, by the folders' times
    svc = ServiceProcess(tmp_path / "svc", eval_runs_dir=str(runs_dir)).start()
    try:
        yield svc, runs_dir
    finally:
        svc.stop()


def test_the_eval_page_lists_the_last_runs_newest_first_with_their_totals(service):
    svc, _ = service
    with svc.client() as client:
        page = client.get("/evals")
        assert page.status_code == 200, page.text
        text = page.text
        assert text.index("qwen3-vl:32b") < text.index("qwen3:8b")
        assert "<td>2/2</td><td>1/2</td><td>1</td>" in text  # solved, solved and proven, passed not proven
        run = client.get("/evals/newer/")
        assert run.status_code == 200 and run.text.count("<tr>") == 3 and 'href="runs/fix-roman-1/report.md"' in run.text
        report = client.get("/evals/newer/runs/fix-roman-1/report.md")
        assert report.headers["content-type"].startswith("text/plain")  # the model's words never run as a page
        assert "<script>" in report.text and report.headers["x-content-type-options"] == "nosniff"


def test_the_eval_page_needs_a_token_and_reaches_nothing_outside_its_folder(service):
    svc, runs_dir = service
    (runs_dir.parent / "secret.md").write_text("not for the web")
    with svc.client(token="wrong") as stranger:
        assert stranger.get("/evals").status_code == 401
    with svc.client(BOB) as user:  # a token, but not an operator's: the reports hold others' tasks
        for path in ("/evals", "/evals/newer/", "/evals/newer/runs/fix-roman-1/report.md"):
            answer = user.get(path)
            assert answer.status_code == 403 and "<script>" not in answer.text, path
    with svc.client() as client:
        for path in ("/evals/..%2Fsecret.md/", "/evals/newer/runs/..%2F..%2F..%2Fsecret.md/report.md",
                     "/evals/nothing/", "/evals/newer/runs/x/report.md"):
            answer = client.get(path)
            assert answer.status_code == 404 and "not for the web" not in answer.text, path
