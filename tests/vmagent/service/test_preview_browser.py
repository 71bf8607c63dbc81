"""The preview page in headless Chromium against a live job: screenshot and terminal
lines show, and inside a sandboxed iframe (Open WebUI's, origin "null") it streams and
reports its height. A PNG of the page is saved to artifacts/preview.png.

The job runs tests/support/scripted_worker.py (`uses_scripted_worker`); with the real loop and a
guest the screenshot is the guest's screen — the page does not change.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.service_harness import ServiceProcess, uses_scripted_worker, wait_for_state
from tests.support.service_harness import stop_workers
from tests.vmagent.service.test_service_api import start, wait_for_event

ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"

websocket = pytest.importorskip("websocket", reason="pip install websocket-client (drives Chromium)")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason="headless Chromium is missing: apt-get install -y chromium"),
]


class Browser:
    """Headless Chromium driven over the DevTools protocol.

    A page with a live event stream never goes idle, so `--dump-dom` and `--screenshot`
    (which wait for the network to settle) either hang or capture the page before the
    first event; the protocol lets the test wait for what it wants to see."""

    def __init__(self, tmp_path: Path):
        profile = tmp_path / f"profile-{time.monotonic_ns()}"
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "--remote-allow-origins=*", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.time() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.time() > deadline:
                raise RuntimeError("Chromium did not open its DevTools port in 30 s")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self._ids = 0
        self.events: list[dict] = []

    def send(self, method: str, session_id: str | None = None, **params):
        self._ids += 1
        message = {"id": self._ids, "method": method, "params": params}
        if session_id:
            message["sessionId"] = session_id
        self.ws.send(json.dumps(message))
        while True:
            message = json.loads(self.ws.recv())
            if "id" not in message:
                self.events.append(message)
            elif message.get("id") == self._ids:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def open(self, url: str, width: int = 1100, height: int = 720) -> None:
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        self.send("Page.enable")
        # Out-of-process iframes (a sandboxed one always is) become targets of their own.
        self.send("Target.setAutoAttach", autoAttach=True, waitForDebuggerOnStart=False, flatten=True)
        self.send("Page.navigate", url=url)

    def evaluate(self, expression: str, session_id: str | None = None):
        return self.send("Runtime.evaluate", session_id=session_id, expression=expression,
                         returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20, session_id: str | None = None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                value = self.evaluate(expression, session_id)
            except RuntimeError:
                value = None
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"the page never showed {expression!r}")

    def iframe_session(self) -> str:
        for event in self.events:
            if event.get("method") == "Target.attachedToTarget" and \
                    event["params"]["targetInfo"]["type"] == "iframe":
                return event["params"]["sessionId"]
        raise AssertionError("the page has no out-of-process iframe")

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path)
    yield b
    b.close()


@pytest.fixture
def live_job(tmp_path):
    svc = ServiceProcess(tmp_path / "svc").start()
    alice = svc.client()
    job = start(alice, "slow job for the preview")
    wait_for_event(alice, job["id"], lambda e: e.get("line") == "tick 5")
    yield svc, alice, job
    svc.stop()
    stop_workers(svc)


@uses_scripted_worker
def test_the_preview_shows_the_screen_and_terminal_of_a_live_job(live_job, browser):
    svc, alice, job = live_job
    browser.open(job["preview_url"])
    browser.wait_for("document.getElementById('screen').complete && "
                     "document.getElementById('screen').naturalWidth === 320")
    terminal = "document.getElementById('terminal')"
    before = browser.wait_for(f"{terminal}.querySelectorAll('div').length > 8 && {terminal}.innerText")
    assert "$ python3 main.py" in before and "hello from the guest" in before
    assert browser.evaluate(f"{terminal}.querySelector('.err').textContent") == "warning: something on stderr"
    assert browser.evaluate(f"{terminal}.querySelector('.cmd').textContent") == "$ python3 main.py"
    # Live: new terminal lines keep arriving while the page is open.
    last_tick = lambda text: max(int(n) for n in re.findall(r"tick (\d+)", text))
    browser.wait_for(f"(function(){{var m={terminal}.innerText.match(/tick (\\d+)/g);"
                     f"return m && parseInt(m[m.length-1].split(' ')[1]) > {last_tick(before) + 5};}})()")
    assert "write main.py" in browser.evaluate("document.getElementById('tasks').textContent")
    assert browser.evaluate("document.getElementById('state').textContent") == "running"
    assert browser.evaluate("document.getElementById('status').textContent") == "working"
    ARTIFACTS.mkdir(exist_ok=True)
    target = ARTIFACTS / "preview.png"
    browser.screenshot(target)
    assert target.read_bytes().startswith(b"\x89PNG") and target.stat().st_size > 5000
    alice.post(f"/jobs/{job['id']}/cancel")
    wait_for_state(alice, job["id"], "cancelled")


@uses_scripted_worker
def test_inside_a_sandboxed_iframe_it_streams_and_reports_its_height(live_job, browser, tmp_path):
    svc, alice, job = live_job
    wrapper = tmp_path / "chat.html"
    # Like Open WebUI: a sandboxed iframe without allow-same-origin, so its origin is "null".
    wrapper.write_text(f"""<!DOCTYPE html><html><body>
<iframe sandbox="allow-scripts" src="{job['preview_url']}" style="width:900px;height:200px"></iframe>
<pre id="log"></pre>
<script>
window.addEventListener("message", function (e) {{
  if (e.data && e.data.type === "iframe:height") {{
    document.getElementById("log").textContent += "height:" + e.data.height + "\\n";
  }}
}});
</script></body></html>""")
    browser.open(wrapper.as_uri())
    log = browser.wait_for("document.getElementById('log').textContent.indexOf('height:') >= 0 && "
                           "document.getElementById('log').textContent")
    assert max(int(h) for h in re.findall(r"height:(\d+)", log)) > 300
    inside = browser.iframe_session()
    assert browser.evaluate("self.origin", inside) == "null"
    # The event stream, opened from origin "null", was allowed by CORS: lines arrived.
    text = browser.wait_for("document.getElementById('terminal').innerText.indexOf('tick') >= 0 && "
                            "document.getElementById('terminal').innerText", session_id=inside)
    assert "$ python3 main.py" in text
    alice.post(f"/jobs/{job['id']}/cancel")
