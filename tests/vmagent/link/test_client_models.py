"""`Vmd.call` against a real vmd (vmd/server/rpc.py over LocalMachines): every answer of a
whole session, from the open to the report, comes back as its verb's result model, with the
nested parts typed too (the facts, the finish outcome, the close, the report's verdict)."""

from __future__ import annotations

from vmagent.link import Vmd
from vmd.contract.check import FinishOutcome
from vmd.contract.results import (CloseResult, Facts, FinishResult, ReportOutcome, RunResult, SessionOpenResult,
                                  TasksResult, WriteFileResult)
from vmd.contract.verdict import Verdict
from vmd.server.rpc import VmdServer
from tests.support.vmd_fakes import LocalMachines, make_config


def test_a_whole_session_answers_models_the_agent_reads_by_attribute(tmp_path):
    config = make_config(tmp_path)
    server = VmdServer(config, LocalMachines()).start()
    try:
        with Vmd(config.socket, timeout=60) as c:
            opened = c.call("session_open", project="typed", task="write hello.txt")
            assert isinstance(opened, SessionOpenResult) and opened.session_id == c.session_id
            assert opened.project == "typed" and opened.project_share is True
            planned = c.call("plan_tasks", tasks=["write hello.txt", "check it"])
            assert isinstance(planned, TasksResult) and "hello.txt" in planned.tasks
            ready = c.call("session_ready", timeout=30)
            assert isinstance(ready.facts, Facts) and ready.facts.project_path and ready.facts.project_mounted
            written = c.call("write_file", path="hello.txt", content="hello\n")
            assert isinstance(written, WriteFileResult) and written.bytes == 6
            ran = c.call("run", command="cat hello.txt")
            assert isinstance(ran, RunResult) and ran.exit_code == 0 and ran.stdout == "hello\n"
            listed = c.call("list_dir", path=".")
            assert "hello.txt" in [entry.name for entry in listed.entries]
            for task in (1, 2):
                c.call("update_task", id=task, status="done")
            finished = c.call("finish", summary="wrote it", verification={"command": "grep -q hello hello.txt"})
            assert isinstance(finished, FinishResult) and isinstance(finished.outcome, FinishOutcome)
            assert finished.outcome.passed is True and finished.outcome.attempts >= 1
            status = c.call("session_status")
            assert status.state == "finished" and status.outcome == finished.outcome
            closed = c.call("session_close")
            assert isinstance(closed, CloseResult) and closed.commit and "hello.txt" in " ".join(closed.files)
            report = c.call("report")
    finally:
        server.stop()
    assert isinstance(report.outcome, ReportOutcome) and report.outcome.commit == closed.commit
    verdict = report.outcome.verdict()
    assert verdict == Verdict.of_outcome(finished.outcome.model_dump())
    assert f"{verdict.label()}**" in report.markdown.splitlines()[2]
