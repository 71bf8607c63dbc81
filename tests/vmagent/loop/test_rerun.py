"""A job whose host is lost runs again on another host from its last pushed checkpoint
(issue 25 item 3; vmagent/loop/rerun.py, the worker's mode "rerun").

Two real vmds on their own sockets and state folders (host A and host B, stand-in
machines: tests/support/vmd_fakes.py) keep their projects on one stand-in Gitea
(tests/support/gitea_server.py); the model is the scripted Ollama server. Host A is lost as a dead
host leaves it: its vmd stops with the session open (nothing closed, nothing pushed at
the end) and its machine is destroyed; what the job service would have kept is the
transcript as it was after the last turn."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.gitea_server import start_gitea
from tests.support.loop_harness import Vmd, agent_config, call, calls, user_texts
from tests.support.ollama_server import Turn, start_ollama
from tests.support.service_harness import real_worker_env
from tests.support.vmd_fakes import LocalMachines, RpcClient, make_config
from vmagent.loop.job import Job
from vmagent.loop import JobSpec, run_job
from vmagent.loop.rerun import parse_last_commit, rerun_job
from vmd.server.rpc import VmdServer

TOKEN = "0123456789abcdef0123456789abcdef01234567"
SPEC = JobSpec(task="greet people", project="greet", owner="alice")
LOST = "host a: its Ray node died"
TASKS = ["write greet.py", "write names.txt and check both"]
CHECK = "python3 greet.py | grep -q hello && grep -qx ada names.txt"


class Host(Vmd):
    """A vmd host of the test (socket, record: loop_harness.Vmd) that can be lost."""

    def lose(self) -> None:
        """As a dead host: vmd gone with its session open, its machine gone too."""
        self.server.stop()
        for machine in self.machines.machines.values():
            machine.destroy()


@contextlib.contextmanager
def host(folder: Path, gitea=None):
    more = dict(gitea_url=gitea.url, gitea_token=TOKEN, gitea_owner_mode="user") if gitea else {}
    machines = LocalMachines()
    config = make_config(folder, **more)
    server = VmdServer(config, machines).start()
    try:
        yield Host(server, machines, config)
    finally:
        server.stop()


def lost_after(turns: list, a: Host, server, tmp_path: Path) -> tuple[Path, str | None]:
    """Play `turns` on host A, then lose A while the model is asked for the next turn.
    -> (the transcript as the job service kept it, A's session id)."""
    kept = tmp_path / "kept" / "transcript.json"

    def host_dies(body: dict) -> Turn:
        # The service's copy: the transcript written after the last whole turn.
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "job" / "transcript.json", kept)
        a.lose()
        return Turn(status=500, error="the worker's host is gone")

    server.add(*turns, host_dies)
    outcome = run_job(SPEC, on_event=lambda e: None, transcript_path=tmp_path / "job" / "transcript.json",
                      config=agent_config(server, vmd_reconnect_s=1), vmd_socket=a.socket)
    assert outcome.state == "failed"  # the old worker's end; the service never sees it
    return kept, outcome.session_id


FIRST_TASK = [
    call("plan_tasks", {"tasks": TASKS}),
    calls(("write_file", {"path": "greet.py", "content": "print('hello')\n"}),
          ("run", {"command": "python3 greet.py"}),
          ("update_task", {"id": 1, "status": "done"})),
]

# On the new machine: the plan again (task 1 done at once: greet.py came back), the rest.
CARRY_ON = [
    call("plan_tasks", {"tasks": TASKS}),
    calls(("update_task", {"id": 1, "status": "done", "note": "greet.py came with the checkpoint"}),
          ("run", {"command": "cat greet.py"}),
          ("write_file", {"path": "names.txt", "content": "ada\n"}),
          ("update_task", {"id": 2, "status": "done"})),
    call("finish", {"summary": "greets", "verification": {"command": CHECK}}),
]


def told(server, words: str) -> bool:
    return any(words in text for body in server.chat_requests for text in user_texts(body))


def test_a_lost_host_runs_the_job_again_elsewhere_from_its_last_checkpoint(tmp_path):
    with start_gitea(tmp_path, token=TOKEN) as gitea, host(tmp_path / "a", gitea) as a, \
            host(tmp_path / "b", gitea) as b, start_ollama() as server:
        kept, old_session = lost_after(FIRST_TASK, a, server, tmp_path)
        server.add(*CARRY_ON)
        events: list[dict] = []
        outcome = rerun_job(kept, lost=LOST, on_event=events.append, config=agent_config(server),
                            vmd_socket=b.socket)

        assert outcome.state == "done", outcome.report
        assert outcome.verification.passed and outcome.verification.proven, outcome.report
        assert outcome.session_id and outcome.session_id != old_session
        # The model was told what happened, in the request that planned again.
        assert told(server, f"The machine was lost with its host ({LOST}); a new machine has the project as of "
                            "'Task 1 done: write greet.py'.")
        assert told(server, "write it again with plan_tasks")
        # The event feed says it, and names the new session.
        texts = [e.get("text", "") for e in events if e["type"] == "status"]
        assert "the job runs again on a new machine: from the checkpoint 'Task 1 done: write greet.py' " \
               f"(the host was lost: {LOST})" in texts
        assert {"type": "session", "session_id": outcome.session_id} in events
        assert events[-1]["type"] == "done" and events[-1]["outcome"]["state"] == "done"
        # Host B's machine got greet.py from Gitea, not from the model: it was never written there.
        b_record = b.record(outcome.session_id)
        assert not [e for e in b_record if e.get("verb") == "write_file" and "greet.py" in json.dumps(e)]
        cat = [r for body in server.chat_requests for r in
               [m.get("content", "") for m in body["messages"] if m.get("role") == "tool"] if "hello" in r]
        assert cat, "cat greet.py on host B showed the checkpoint's file"
        # The transcript on disk is the new session's, with the report's note.
        job = Job.load(kept)
        assert job.session_id == outcome.session_id and job.state == "done"
        assert any("was lost" in n and "Task 1 done: write greet.py" in n for n in job.notes)

    # Gitea's history holds the work of both hosts: A's checkpoint, then B's commits on top.
    def git_log(fmt: str) -> str:
        return subprocess.run(["git", "--git-dir", str(gitea.repo_path("alice", "greet")), "log", "--reverse",
                               f"--format={fmt}", "main"], capture_output=True, text=True, check=True).stdout

    assert git_log("%s").splitlines() == ["Task 1 done: write greet.py", "Task 1 done: write greet.py",
                                          "Task 2 done: write names.txt and check both", "greet people"]
    bodies = git_log("%b")
    assert f"vmagent session {old_session}" in bodies and f"vmagent session {outcome.session_id}" in bodies


def test_a_job_lost_before_any_checkpoint_runs_again_from_its_start(tmp_path):
    # Without Gitea: host B knows nothing of A's project; it holds an older job's commit of
    # the same name, which is not this job's checkpoint.
    with host(tmp_path / "a") as a, host(tmp_path / "b") as b, start_ollama() as server:
        old = RpcClient(b.config.socket, timeout=60)
        old.call("session_open", project="greet", owner="alice", task="an older job")
        old.call("plan_tasks", tasks=["something else"])
        old.call("run", command="echo old > old.txt")
        old.call("update_task", id=1, status="done")
        old.call("session_close")
        old.close()

        kept, _ = lost_after([call("plan_tasks", {"tasks": TASKS})], a, server, tmp_path)
        server.add(call("plan_tasks", {"tasks": TASKS}),
                   calls(("write_file", {"path": "greet.py", "content": "print('hello')\n"}),
                         ("write_file", {"path": "names.txt", "content": "ada\n"}),
                         ("run", {"command": "python3 greet.py"}),
                         ("update_task", {"id": 1, "status": "done"}),
                         ("update_task", {"id": 2, "status": "done"})),
                   call("finish", {"summary": "greets", "verification": {"command": CHECK}}))
        events: list[dict] = []
        outcome = rerun_job(kept, lost=LOST, on_event=events.append, config=agent_config(server),
                            vmd_socket=b.socket)
    assert outcome.state == "done" and outcome.verification.passed, outcome.report
    assert told(server, "a new machine has the project as of its start (no checkpoint of this job had reached it)")
    assert not told(server, "as of 'an older job'")
    assert any(e.get("text", "").startswith("the job runs again on a new machine: from its start")
               for e in events if e["type"] == "status")


def test_a_call_in_flight_when_the_host_went_is_answered_and_a_bad_transcript_is_a_failed_job(tmp_path):
    with host(tmp_path / "b") as b, start_ollama() as server:
        job = Job(spec=SPEC, transcript_path=tmp_path / "kept" / "transcript.json")
        job.session_id = "gone-session"
        job.messages = [{"role": "system", "content": "be good"}, {"role": "user", "content": "the task"},
                        {"role": "assistant", "content": "",
                         "tool_calls": [{"function": {"name": "run", "arguments": {"command": "make"}}}]}]
        job.save()
        server.add(Turn(status=500, error="stop here"))
        rerun_job(job.transcript_path, lost=LOST, on_event=lambda e: None,
                  config=agent_config(server), vmd_socket=b.socket)
        sent = server.chat_requests[0]["messages"]
        assert sent[3]["role"] == "tool" and sent[3]["content"].startswith(
            "INTERRUPTED: the machine was lost with its host")
        assert sent[4]["role"] == "user" and sent[4]["content"].startswith("The machine was lost")

    (tmp_path / "torn.json").write_text("{not json")
    events: list[dict] = []
    outcome = rerun_job(tmp_path / "torn.json", lost=LOST, on_event=events.append, vmd_socket="/nonexistent")
    assert outcome.state == "failed" and "could not be read" in outcome.report
    assert events[-1]["type"] == "done"


def test_an_answer_meant_for_the_lost_host_reaches_the_model_with_the_news(tmp_path):
    with host(tmp_path / "b") as b, start_ollama() as server:
        job = Job(spec=SPEC, transcript_path=tmp_path / "kept" / "transcript.json")
        job.session_id, job.state, job.question = "gone-session", "question", "Which colour?"
        job.messages = [{"role": "system", "content": "be good"}, {"role": "user", "content": "the task"},
                        {"role": "assistant", "content": "",
                         "tool_calls": [{"function": {"name": "ask_user", "arguments": {"question": "Which colour?"}}}]},
                        {"role": "tool", "tool_name": "ask_user", "content": "asked; waiting"}]
        job.save()
        server.add(Turn(status=500, error="stop here"))
        rerun_job(job.transcript_path, lost=LOST, on_event=lambda e: None, config=agent_config(server),
                  vmd_socket=b.socket, answer="blue")
        last = server.chat_requests[0]["messages"][-1]
    assert last["role"] == "user" and last["content"].startswith("The machine was lost with its host")
    assert last["content"].endswith("The person answered: blue")


def test_the_last_commit_is_read_from_the_history_verbs_log():
    text = ("commit " + "a" * 40 + "\nAuthor: vmd <vmd@localhost>\nDate:   2026-01-01 00:00:00 +0000\n\n"
            "    Task 2 done: write greet.py\n    \n    vmagent session s-1\n\n greet.py | 1 +\n"
            " 1 file changed, 1 insertion(+)\n")
    assert parse_last_commit(text) == ("a" * 40, "Task 2 done: write greet.py",
                                       "Task 2 done: write greet.py\n\nvmagent session s-1")


def test_the_worker_runs_a_job_in_mode_rerun(tmp_path):
    with start_gitea(tmp_path, token=TOKEN) as gitea, host(tmp_path / "a", gitea) as a, \
            host(tmp_path / "b", gitea) as b, start_ollama() as server:
        kept, _ = lost_after(FIRST_TASK, a, server, tmp_path)
        server.add(*CARRY_ON)
        job_dir = tmp_path / "worker-job"
        job_dir.mkdir()
        shutil.copy(kept, job_dir / "transcript.json")
        (job_dir / "job.json").write_text(json.dumps({
            "job_id": "j1", "spec": SPEC.model_dump(), "mode": "rerun", "lost": LOST, "cancel": False,
            "answer": None, "approved": None, "vmd_socket": b.socket}))
        env = {k: v for k, v in os.environ.items() if k != "VMAGENT_CONFIG"}
        env.update(real_worker_env(server.url))
        env["VMAGENT_SCREEN_WATCH_S"] = "0"
        done = subprocess.run([sys.executable, "-m", "vmagent.worker", "--job-dir", str(job_dir)], env=env,
                              capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[3])
    frames = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(f["type"] == "status" and f["text"].startswith(
        "the job runs again on a new machine: from the checkpoint 'Task 1 done: write greet.py'") for f in frames)
    assert frames[-1]["type"] == "done" and frames[-1]["outcome"]["state"] == "done", frames[-1]
    assert frames[-1]["outcome"]["verification"]["passed"] is True
