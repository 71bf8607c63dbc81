"""While a job waits for a person the preview keeps its last frame (issue 37 item 2).

vmd takes a screenshot before it pauses the guest for a question and `peek` shows that
frame while the session waits; the worker's screen watcher takes one last look, so the
preview (and Open WebUI's embed) shows what the question is about with "waiting for your
answer" over it. The embed itself opens from the job's first event, while the machine
still boots. Real vmd (stand-in machines), the real worker and loop, a scripted Ollama.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.loop_harness import call, running_vmd
from tests.support.ollama_server import start_ollama
from tests.support.service_harness import REAL_WORKER, ServiceProcess, real_worker_env, stop_workers, wait_for_state
from tests.vmagent.loop.test_loop import PLAN
from tests.vmagent.service.test_preview_browser import CHROMIUM, Browser
from tests.vmagent.service.test_service_api import start
from tests.support.vmd_fakes import PNG_1X1
from tests.support.vmd_wire import WireVmd

QUESTION = "Which port should the server use?"


def _service(tmp_path, vmd, server) -> ServiceProcess:
    # The watcher's own ticks never come (600 s): a frame in the preview is the kept one.
    env = {**real_worker_env(server.url), "VMAGENT_SCREEN_WATCH_S": "600"}
    return ServiceProcess(tmp_path / "svc", worker_command=REAL_WORKER, vmd_socket=vmd.socket, env=env).start()


def _events(client, job_id: str) -> list[dict]:
    body = client.get(f"/jobs/{job_id}/events", params={"follow": "false"}).text
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {\"type")]


def test_peek_shows_the_kept_frame_while_the_session_waits_and_the_live_screen_after(tmp_path):
    with running_vmd(tmp_path) as vmd:
        c = WireVmd(vmd.socket, timeout=60).connect()
        c.call("session_open", os="debian", project="kept", task="t")
        c.call("plan_tasks", tasks=["one"])
        assert not c.call("peek").get("kept")
        shots = len(vmd.machines.shots)
        c.call("ask_user", question=QUESTION)
        assert len(vmd.machines.shots) == shots + 1, "a frame is taken before the guest is paused"
        seen = c.call("peek")
        assert seen["available"] and seen["kept"] and seen["png_base64"], seen
        assert "wait for a person" in seen["text"]
        c.call("session_resume", answer="8080")
        again = c.call("peek")
        assert again["available"] and not again.get("kept")  # the guest draws again
        c.call("session_close")


def test_a_question_leaves_the_agents_screen_in_the_preview_though_the_agent_never_looked(tmp_path):
    script = [PLAN, call("run", {"command": "echo up"}), call("ask_user", {"question": QUESTION})]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        svc = _service(tmp_path, vmd, server)
        try:
            alice = svc.client()
            job = start(alice, "serve it", project="kept")
            waiting = wait_for_state(alice, job["id"], {"needs_input", "failed"}, timeout=60)
            assert waiting["state"] == "needs_input", waiting["report"]
            events = _events(alice, job["id"])
            assert not any(e["type"] == "screenshot" and not e.get("kept") for e in events)
            kept = [e for e in events if e["type"] == "screenshot" and e.get("kept")]
            assert len(kept) == 1, events
            screen = alice.get(f"/jobs/{job['id']}/screen.png")
            assert screen.status_code == 200 and screen.content == PNG_1X1
            # The kept look lands before the job's last frame: the page shows it with the question.
            page = alice.get(f"/jobs/{job['id']}/preview", params={"token": waiting["preview_url"].split("token=")[1]})
            assert '<div id="waiting" hidden>' not in page.text
            assert f'<b id="waitingtitle">Waiting for your answer</b>: <span id="question">{QUESTION}' in page.text
            assert 'id="screen" alt="the guest\'s screen" src="screen.png?' in page.text
        finally:
            svc.stop()
            stop_workers(svc)


def test_the_preview_opens_with_the_plan_while_the_machine_still_boots(tmp_path):
    """The loop plans while the guest boots, then waits for it: the embed is open by then
    (it used to open at the first command or screenshot), showing the plan."""
    script = [PLAN, call("run", {"command": "echo up"})]
    with running_vmd(tmp_path, boot_seconds=60.0) as vmd, start_ollama(script) as server:
        svc = _service(tmp_path, vmd, server)
        try:
            alice = svc.client()
            job = start(alice, "serve it", project="early")
            deadline = time.time() + 30
            while "waiting for the machine" not in (job.get("status_line") or "") and time.time() < deadline:
                time.sleep(0.1)
                job = alice.get(f"/jobs/{job['id']}").json()
            assert "waiting for the machine" in job["status_line"], job
            assert job["preview_ready"] is True and job["state"] == "running"
            assert not [e for e in _events(alice, job["id"]) if e["type"] in ("command", "screenshot")]
            token = job["preview_url"].split("token=")[1]
            page = alice.get(f"/jobs/{job['id']}/preview", params={"token": token}).text
            assert "once the machine is up" in page and "write hello.py" in page
            assert '<div id="waiting" hidden>' in page  # nothing is asked
            # A cancel while the machine boots ends the job without waiting for the boot (60 s
            # here): the loop asks vmd in 2 s slices, and vmd's close cuts the boot short. It
            # waited for the whole boot, and up to 30 s more, with 30 s slices.
            cancelled_at = time.monotonic()
            alice.post(f"/jobs/{job['id']}/cancel")
            ended = wait_for_state(alice, job["id"], {"cancelled", "failed"}, timeout=180)
            assert ended["state"] == "cancelled", ended
            assert time.monotonic() - cancelled_at < 40, "the cancel waited for the machine's boot"
        finally:
            svc.stop()
            stop_workers(svc)


@pytest.mark.browser
@pytest.mark.skipif(not __import__("pathlib").Path(CHROMIUM).exists(),
                    reason="headless Chromium is missing: apt-get install -y chromium")
def test_in_the_browser_the_kept_frame_shows_under_the_waiting_banner(tmp_path):
    pytest.importorskip("websocket", reason="pip install websocket-client (drives Chromium)")
    script = [PLAN, call("run", {"command": "echo up"}), call("ask_user", {"question": QUESTION})]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        svc = _service(tmp_path, vmd, server)
        browser = Browser(tmp_path)
        try:
            alice = svc.client()
            job = start(alice, "serve it", project="kept")
            browser.open(job["preview_url"])
            wait_for_state(alice, job["id"], {"needs_input", "failed"}, timeout=60)
            # The question comes with the state's event, which may be read a moment after the
            # banner is shown (CI under load read the banner between the two): waited for too.
            browser.wait_for("!document.getElementById('waiting').hidden && "
                             "document.getElementById('question').textContent.length > 0 && "
                             "document.getElementById('screen').complete && "
                             "document.getElementById('screen').naturalWidth === 1", timeout=30)
            banner = browser.evaluate("document.getElementById('waiting').innerText")
            assert banner.startswith("Waiting for your answer") and QUESTION in banner
            assert browser.evaluate("document.getElementById('noscreen').hidden") is True
        finally:
            browser.close()
            svc.stop()
            stop_workers(svc)
