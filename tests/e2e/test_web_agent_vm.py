"""A whole job on a real guest that learns an API from the web first: `vmd serve` and
`vmagent run` as processes, the scripted model, Debian's searx and a page server on
loopback. The agent searches while the guest boots, reads the page the search found,
writes code from it in the guest (which has no network: the reading ran on the host),
and finishes verified; the report lists the two sources."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.loop_harness import call, calls, tool_results
from tests.support.ollama_server import start_ollama
from tests.support.searx_server import start_searx
from tests.e2e.test_agent_vm import ROOT, vmd_serve  # noqa: F401 (the fixture)
from tests.support.web_pages import PageServer

pytestmark = pytest.mark.vm

# What the page teaches (tests/support/web_pages.py DOC_HTML): frobnicate(count, mode) returns one
# widget per count. The code the agent writes follows it.
FROB = ("def frobnicate(count, mode):\n"
        "    if count < 0:\n        raise ValueError('negative count')\n"
        "    return [f'widget-{n}-{mode}' for n in range(count)]\n")
USE = "from frob import frobnicate\nwidgets = frobnicate(3, mode='fast')\nprint(len(widgets), widgets[0])\n"
CHECK = "cd /mnt/project && test \"$(python3 use_frob.py)\" = '3 widget-0-fast'"


def script(docs: str) -> list:
    return [
        calls(("plan_tasks", {"tasks": ["learn the frobnicate API", "write frob.py and use_frob.py"]}),
              ("web_search", {"query": "frobnicate"}), content="Looking the API up while the machine boots."),
        call("read_page", {"url": docs}),
        calls(("update_task", {"id": 1, "status": "done", "note": "read the reference"}),
              ("write_file", {"path": "/mnt/project/frob.py", "content": FROB}),
              ("write_file", {"path": "/mnt/project/use_frob.py", "content": USE})),
        call("run", {"command": "cd /mnt/project && python3 use_frob.py"}),
        call("update_task", {"id": 2, "status": "done", "note": "use_frob.py prints 3 widget-0-fast"}),
        call("finish", {"summary": "frob.py follows the reference; use_frob.py calls it",
                        "verification": {"command": CHECK}}),
    ]


def test_a_job_reads_the_docs_on_the_host_and_writes_code_from_them_in_the_guest(tmp_path, vmd_serve):  # noqa: F811
    socket, state = vmd_serve
    pages = PageServer()
    docs = f"{pages.base}/docs"
    searx = None
    try:
        searx = start_searx(tmp_path / "searx", [(docs, "Frobnicate API reference", "How to call frobnicate.")])
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VMAGENT_", "OLLAMA_"))}
        with start_ollama(script(docs)) as model:
            env.update(VMD_SOCKET=str(socket), OLLAMA_HOST=model.url, VMAGENT_RETRIES="0",
                       VMAGENT_SEARXNG_URL=searx.url, VMAGENT_WEB_ALLOW=f"127.0.0.1:{pages.port}=the test's pages")
            done = subprocess.run([sys.executable, "-m", "vmagent.cli", "run", "Write frob.py from the frob docs",
                                   "--os", "debian", "--project", "frob", "--transcript",
                                   str(tmp_path / "transcript.json")],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    finally:
        if searx is not None:  # stopped whatever the job did, not only when it returned
            searx.close()
        pages.close()
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout
    report = done.stdout
    assert "✅ verified" in report and CHECK in report
    results = tool_results(model.chat_requests[-1])
    assert any(r.startswith("web_search 'frobnicate': 1 result.") and docs in r for r in results)
    assert any(f"untrusted content from {docs}" in r and "frob.frobnicate(3, mode=\"fast\")" in r for r in results)
    assert "## Sources read on the web" in report
    sources = report.split("## Sources read on the web", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in sources.splitlines() if line.startswith("- ")]
    assert lines == ["- searched `frobnicate`: `1 result (searxng)`",
                     f"- read `{docs}` — `Frobnicate API reference` (`characters 0-4,000 of 9,800`)"], sources
    assert (state / "projects" / "local" / "frob" / "frob.py").read_text() == FROB
