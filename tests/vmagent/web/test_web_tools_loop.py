"""web_search and read_page through the whole loop: a real vmd (stand-in machines), the
scripted model, Debian's searx on loopback and a loopback page server. The tools are run
by vmagent on the host, offered from the first turn to the last when an engine is set and
never otherwise, each call is a line of vmd's record and of the live feed, and the report
lists the sources read."""

from __future__ import annotations


import pytest

from tests.support.loop_harness import agent_config, call, calls, running_vmd, sent_tool_names, tool_results
from tests.support.ollama_server import start_ollama
from tests.support.searx_server import start_searx
from tests.support.web_pages import PageServer
from vmagent.loop import JobSpec, run_job
from vmagent.tools import OFFERED_TOOLS


@pytest.fixture(scope="module")
def pages():
    server = PageServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def searx(tmp_path_factory, pages):
    rows = [(f"{pages.base}/docs", "Frobnicate API reference", "How to call frobnicate(count, mode)."),
            ("https://other.example/", "Cooking pasta", "Boil water.")]
    server = start_searx(tmp_path_factory.mktemp("searx"), rows)
    yield server
    server.close()


def script(docs: str) -> list:
    return [
        calls(("plan_tasks", {"tasks": ["read the frob docs", "write use_frob.py"]}),
              ("web_search", {"query": "frobnicate", "max_results": 3}), content="Looking it up while it boots."),
        call("read_page", {"url": docs, "max_chars": 3000}),
        call("read_page", {"url": docs, "max_chars": 3000, "offset": 3000}),
        call("read_page", {"url": "http://169.254.169.254/latest/meta-data/"}),
        calls(("write_file", {"path": "use_frob.py", "content": "print('frobnicate(3, mode=\"fast\")')\n"}),
              ("run", {"command": "python3 use_frob.py"}),
              ("update_task", {"id": 1, "status": "done", "note": "read it"}),
              ("update_task", {"id": 2, "status": "done", "note": "prints the call"})),
        call("finish", {"summary": "use_frob.py shows the documented call",
                        "verification": {"command": "python3 use_frob.py | grep -q 'mode=\"fast\"'"}}),
    ]


def test_a_job_searches_reads_and_the_report_lists_its_sources(tmp_path, pages, searx):
    docs = f"{pages.base}/docs"
    events: list[dict] = []
    with running_vmd(tmp_path) as vmd, start_ollama(script(docs)) as model:
        config = agent_config(model, searxng_url=searx.url, web_allow=[f"127.0.0.1:{pages.port}=the test's pages"])
        outcome = run_job(JobSpec(task="write use_frob.py from the frob docs", project="frob"),
                          on_event=events.append, transcript_path=tmp_path / "job" / "t.json", config=config,
                          vmd_socket=vmd.socket)
        record = vmd.record(outcome.session_id)
    assert outcome.state == "done" and outcome.verification_passed, outcome.report
    # The same tools in every request, the two web tools at the end.
    offered = {tuple(sent_tool_names(body)) for body in model.chat_requests}
    assert offered == {OFFERED_TOOLS + ("web_search", "read_page")}
    results = tool_results(model.chat_requests[-1])
    search = next(r for r in results if r.startswith("web_search 'frobnicate'"))
    assert f"1. Frobnicate API reference\n   {docs}\n   How to call frobnicate(count, mode)." in search
    first, second, refused = [r for r in results if r.startswith(("read_page", "REFUSED: http://169"))]
    assert f"untrusted content from {docs}" in first and "# Frobnicate API" in first
    assert "read on with read_page offset=3000" in first and "characters 3,000-6,000 below" in second
    assert refused.startswith("REFUSED: http://169.254.169.254/latest/meta-data/ is refused: 169.254.169.254 "
                              "is a cloud metadata address.")
    assert pages.hits["/docs"] == 1  # the second part came from the cache
    # vmd's record and the report
    assert [(e["source"], e["target"], e["ok"]) for e in record if e["kind"] == "web"] == [
        ("search", "frobnicate", True), ("page", docs, True), ("page", docs, True),
        ("page", "http://169.254.169.254/latest/meta-data/", False)]
    assert "## Sources read on the web" in outcome.report
    assert "- searched `frobnicate`: `1 result (searxng)`" in outcome.report
    assert (f"- read `{docs}` — `Frobnicate API reference` (`characters 3,000-6,000 of" in outcome.report
            and ", 2 times)" in outcome.report)
    assert "- could not read `http://169.254.169.254/latest/meta-data/`: `" in outcome.report
    # The live feed says each one.
    statuses = [e["text"] for e in events if e["type"] == "status"]
    assert "searched frobnicate: 1 result (searxng)" in statuses
    assert any(s.startswith(f"read {docs}: characters 0-3,000 of") for s in statuses)


def test_no_engine_and_no_setting_offers_no_web_tool(tmp_path):
    with running_vmd(tmp_path) as vmd, start_ollama([call("web_search", {"query": "x"})]) as model:
        outcome = run_job(JobSpec(task="t", project="p"), on_event=lambda e: None,
                          transcript_path=tmp_path / "job" / "t.json", config=agent_config(model), vmd_socket=vmd.socket)
    assert sent_tool_names(model.chat_requests[0]) == list(OFFERED_TOOLS)
    assert any("web_search" in r and r.startswith("ERROR:") for r in tool_results(model.chat_requests[1]))
    assert outcome.state in ("failed", "done")


def test_a_job_whose_person_turned_the_web_off_offers_no_web_tool(tmp_path, searx):
    with running_vmd(tmp_path) as vmd, start_ollama([call("read_page", {"url": "https://docs.python.org/3/"})]) as model:
        run_job(JobSpec(task="t", project="p", web=False), on_event=lambda e: None,
                transcript_path=tmp_path / "job" / "t.json", config=agent_config(model, searxng_url=searx.url),
                vmd_socket=vmd.socket)
    assert sent_tool_names(model.chat_requests[0]) == list(OFFERED_TOOLS)
    assert any(r.startswith("ERROR:") and "read_page" in r for r in tool_results(model.chat_requests[1]))


def test_an_older_job_database_lets_its_jobs_use_the_web(tmp_path):
    import sqlite3

    from vmagent.service.store import Store
    from vmagent.service.worker_process import job_spec

    Store(tmp_path).close()
    with sqlite3.connect(tmp_path / "jobs.sqlite3") as conn:  # the jobs table before the `web` column
        conn.execute("ALTER TABLE jobs DROP COLUMN web")
        conn.execute("INSERT INTO jobs (id, owner, task, os, state, preview_secret, created, updated) "
                     "VALUES ('old', 'alice', 't', 'debian', 'done', 's', 1, 2)")
    store = Store(tmp_path)
    assert job_spec(store.get_job("old")).web is True
    off = store.create_job(owner="alice", task="t", os="debian", project=None, web=False)
    assert job_spec(store.get_job(off["id"])).web is False
    store.close()


def test_the_opening_message_says_the_web_tools_work_while_the_machine_boots(tmp_path, searx):
    from tests.support.loop_harness import user_texts

    with running_vmd(tmp_path) as vmd, start_ollama([call("plan_tasks", {"tasks": ["a"]})]) as model:
        run_job(JobSpec(task="t", project="p"), on_event=lambda e: None, transcript_path=tmp_path / "job" / "t.json",
                config=agent_config(model, searxng_url=searx.url), vmd_socket=vmd.socket)
    opening = user_texts(model.chat_requests[0])[0]
    now = opening.split("Until the machine is up only ", 1)[1].split(" work;", 1)[0]
    assert "web_search" in now and "read_page" in now and "run" not in now.split(", ")
    assert opening.endswith(" Use web_search and read_page (outside the machine) to look up what you are not sure "
                            "of instead of guessing.")
