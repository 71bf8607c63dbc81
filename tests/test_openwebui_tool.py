"""The Open WebUI tool file, loaded as Open WebUI loads it (its source exec'd into a fresh
module) and called with the arguments Open WebUI injects, against a running job service.

These use tests/scripted_worker.py as the job process (`uses_scripted_worker`); the full
story of the issue — a question, both services restarted, the same guest (same boot id)
carrying on — runs on a real guest in tests/test_openwebui_vm.py.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.service_harness import SERVICE, ServiceProcess, uses_scripted_worker

TOOL_FILE = Path(__file__).resolve().parent.parent / "vmagent" / "openwebui" / "vm_agent.py"
USER = {"id": "user-7", "email": "ada@example.org", "name": "Ada", "role": "user"}


def load_tool():
    """What Open WebUI does with a tool's source: exec it into a new module, take `Tools`."""
    source = TOOL_FILE.read_text()
    module = types.ModuleType("tool_vm_agent")
    exec(compile(source, str(TOOL_FILE), "exec"), module.__dict__)
    return module


class Recorder:
    def __init__(self):
        self.events: list[dict] = []

    async def __call__(self, event: dict) -> None:
        self.events.append(event)

    def statuses(self) -> list[dict]:
        return [e["data"] for e in self.events if e["type"] == "status"]

    def embeds(self) -> list[dict]:
        return [e["data"] for e in self.events if e["type"] == "embeds"]


@pytest.fixture
def service(tmp_path):
    svc = ServiceProcess(tmp_path / "svc").start()
    yield svc
    svc.stop()
    from tests.test_service_api import _stop_workers

    _stop_workers(svc)


@pytest.fixture
def tools(service):
    module = load_tool()
    tools = module.Tools()
    tools.valves = module.Tools.Valves(service_url=service.url, service_token=SERVICE, poll_interval=0.2)
    return tools


def injected(method, recorder, chat_id: str, message_id: str = "m-1", dialog=None) -> dict:
    """Open WebUI passes only the extra arguments a method's signature asks for; `dialog`,
    when given, is offered as `__event_call__` (absent otherwise, as where Open WebUI has
    no browser session to ask)."""
    offered = {"__user__": USER, "__chat_id__": chat_id, "__message_id__": message_id,
               "__event_emitter__": recorder}
    if dialog is not None:
        offered["__event_call__"] = dialog
    return {k: v for k, v in offered.items() if k in inspect.signature(method).parameters}


def call(method, chat_id: str, *, dialog=None, **kwargs):
    recorder = Recorder()
    result = asyncio.run(method(**injected(method, recorder, chat_id, dialog=dialog), **kwargs))
    return result, recorder


class Dialog:
    """Open WebUI's `__event_call__` as the person's browser answers it: each event is kept,
    and the answer is what `click` gives (Open WebUI's dialog answers True for Confirm and
    False for Cancel; a timed-out one answers {"error": ...}; an older one raises)."""

    def __init__(self, click):
        self.click = click
        self.events: list[dict] = []

    async def __call__(self, event: dict):
        self.events.append(event)
        if isinstance(self.click, BaseException):
            raise self.click
        return self.click


class RecordingProxy:
    """Stands between the tool and the job service and keeps every request that reaches the
    service as "METHOD /path", so that a test asserts on what the service was asked to do,
    not on what the tool says it did."""

    def __init__(self, target: str):
        self.requests: list[str] = []
        proxy = self
        upstream = httpx.Client(base_url=target, timeout=30)

        class Handler(BaseHTTPRequestHandler):
            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.requests.append(f"{self.command} {self.path.split('?')[0]}")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                reply = upstream.request(self.command, self.path, headers=headers, content=body)
                self.send_response(reply.status_code)
                self.send_header("Content-Type", reply.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(reply.content)))
                self.end_headers()
                self.wfile.write(reply.content)

            do_GET = do_POST = forward

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.upstream = upstream
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def decisions(self) -> list[str]:
        return [r for r in self.requests if r.endswith(("/approve", "/deny", "/answer"))]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.upstream.close()


@pytest.fixture
def proxy(service):
    recording = RecordingProxy(service.url)
    yield recording
    recording.close()


@pytest.fixture
def watched_tools(proxy):
    """The tool, reaching the job service through the recording proxy."""
    module = load_tool()
    tools = module.Tools()
    tools.valves = module.Tools.Valves(service_url=proxy.url, service_token=SERVICE, poll_interval=0.2)
    return tools


def jobs_of(service, chat_id: str) -> list[dict]:
    client = service.client(SERVICE, {"X-OpenWebUI-User-Id": USER["id"]})
    return client.get("/jobs", params={"chat_id": chat_id}).json()["jobs"]


def test_the_file_has_open_webui_frontmatter_and_typed_documented_methods():
    source = TOOL_FILE.read_text()
    header = source.split('"""')[1]
    for key in ("title:", "author:", "version:", "requirements: httpx"):
        assert key in header
    module = load_tool()
    assert set(module.Tools.Valves.model_fields) >= {"service_url", "service_token", "default_os", "poll_interval"}
    assert module.Tools.UserValves.model_fields is not None
    for name in ("run_task_in_vm", "answer_vm_question", "ask_about_vm_job", "vm_job_status", "cancel_vm_job"):
        method = getattr(module.Tools(), name)
        assert asyncio.iscoroutinefunction(method) and method.__doc__ and ":return:" in method.__doc__
        assert "return" in method.__annotations__ and "__event_emitter__" in method.__annotations__
    # Where an approval request can surface, the method asks Open WebUI for its dialog.
    for name in ("run_task_in_vm", "answer_vm_question", "vm_job_status"):
        assert "__event_call__" in inspect.signature(getattr(module.Tools(), name)).parameters


@uses_scripted_worker
def test_a_task_runs_to_its_report_with_status_and_one_preview_embed(tools, service):
    report, recorder = call(tools.run_task_in_vm, "chat-a", task="write hello world", os="", project="")
    assert report.startswith("# Job done: write hello world")
    statuses = recorder.statuses()
    assert statuses[0] == {"description": "Starting a virtual machine for the task…", "done": False}
    assert statuses[-1]["done"] is True and all(s["done"] is False for s in statuses[:-1])
    embeds = recorder.embeds()
    assert len(embeds) == 1 and embeds[0]["replace"] is True
    url = embeds[0]["embeds"][0]
    assert "/preview?token=" in url and httpx.get(url).status_code == 200
    [job] = jobs_of(service, "chat-a")
    assert job["owner"] == USER["id"] and job["message_id"] == "m-1" and job["os"] == "debian"


@uses_scripted_worker
def test_a_question_goes_to_the_person_and_the_answer_resumes_the_job(tools, service):
    text, recorder = call(tools.run_task_in_vm, "chat-q", task="question first")
    assert "Which port should the server use?" in text and "answer_vm_question" in text
    assert recorder.statuses()[-1] == {"description": "The VM agent has a question.", "done": True}
    # A new run_task_in_vm in the same chat does not start a second job while one waits.
    again, _ = call(tools.run_task_in_vm, "chat-q", task="something else")
    assert "Which port" in again and len(jobs_of(service, "chat-q")) == 1
    report, recorder = call(tools.answer_vm_question, "chat-q", answer="8080")
    assert "answer='8080'" in report and "boot_id=" in report
    assert recorder.statuses()[-1]["done"] is True
    reply, _ = call(tools.ask_about_vm_job, "chat-q", question="which boot_id did it have?")
    assert "boot_id" in reply


# What people typed in reply to a network request, each of which the tool once read as
# approval; "yes" is here too: typed words never decide, whatever they say.
TYPED_REPLIES = ["You must not touch the network", "Okay... actually no, don't",
                 "Allowing network access is a bad idea, no", "yes"]


def job_state(service, chat_id: str) -> str:
    [job] = jobs_of(service, chat_id)
    return job["state"]


@uses_scripted_worker
def test_typed_replies_never_decide_an_approval_request(watched_tools, proxy, service):
    text, _ = call(watched_tools.run_task_in_vm, "chat-u", task="unfreeze please")
    assert "asks for approval" in text and "the package index" in text
    assert "only by a click" in text and "Nothing was approved" in text
    for reply in TYPED_REPLIES:
        text, recorder = call(watched_tools.answer_vm_question, "chat-u", answer=reply)
        assert "Nothing was approved or denied" in text and "only by a click" in text, reply
        assert "/approve" in text and "vm_job_status" in text
        assert recorder.statuses()[-1]["done"] is True
    assert proxy.decisions() == []
    assert job_state(service, "chat-u") == "needs_approval"


@uses_scripted_worker
def test_a_confirm_click_approves_exactly_once(watched_tools, proxy, service):
    dialog = Dialog(True)
    report, recorder = call(watched_tools.run_task_in_vm, "chat-ok", task="unfreeze please", dialog=dialog)
    [event] = dialog.events
    assert event["type"] == "confirmation" and set(event["data"]) == {"title", "message"}
    assert "the package index" in event["data"]["message"]
    [job] = jobs_of(service, "chat-ok")
    assert proxy.decisions() == [f"POST /jobs/{job['id']}/approve"]
    assert "approved=True" in report and job["state"] == "done"
    assert recorder.statuses()[-1] == {"description": "The VM agent finished.", "done": True}


@uses_scripted_worker
def test_a_cancel_click_denies_whatever_the_typed_reply_says(watched_tools, proxy, service):
    text, _ = call(watched_tools.run_task_in_vm, "chat-no", task="unfreeze please")
    assert "Nothing was approved" in text
    dialog = Dialog(False)
    report, _ = call(watched_tools.answer_vm_question, "chat-no", answer="yes", dialog=dialog)
    [job] = jobs_of(service, "chat-no")
    assert len(dialog.events) == 1
    assert proxy.decisions() == [f"POST /jobs/{job['id']}/deny"]
    assert "approved=False" in report and job["state"] == "done"


@uses_scripted_worker
def test_the_status_call_shows_the_dialog_for_a_waiting_request(watched_tools, proxy, service):
    call(watched_tools.run_task_in_vm, "chat-s", task="unfreeze please")
    assert proxy.decisions() == []
    report, _ = call(watched_tools.vm_job_status, "chat-s", dialog=Dialog(True))
    [job] = jobs_of(service, "chat-s")
    assert proxy.decisions() == [f"POST /jobs/{job['id']}/approve"] and "approved=True" in report


@uses_scripted_worker
@pytest.mark.parametrize("click", [
    None,  # Open WebUI's dialog timed out (some versions answer None)
    "yes",
    1,
    {"error": "Event call timed out. The browser tab may be inactive or closed."},
    TimeoutError("no answer from the browser"),
], ids=["none", "text-yes", "one", "error-dict", "raises"])
def test_anything_but_a_boolean_click_leaves_the_request_waiting(watched_tools, proxy, service, click):
    dialog = Dialog(click)
    text, recorder = call(watched_tools.run_task_in_vm, "chat-w", task="unfreeze please", dialog=dialog)
    assert len(dialog.events) == 1 and "Nothing was approved or denied" in text
    assert recorder.statuses()[-1]["done"] is True
    text, _ = call(watched_tools.answer_vm_question, "chat-w", answer="yes", dialog=dialog)
    text, _ = call(watched_tools.vm_job_status, "chat-w", dialog=dialog)
    assert len(dialog.events) == 3 and "Nothing was approved or denied" in text
    assert proxy.decisions() == []
    assert job_state(service, "chat-w") == "needs_approval"


@uses_scripted_worker
def test_a_cancelled_call_leaves_the_job_running_and_the_next_call_reattaches(tools, service):
    async def scenario():
        recorder = Recorder()
        call_task = asyncio.create_task(tools.run_task_in_vm(
            task="slow job", **injected(tools.run_task_in_vm, recorder, "chat-c")))
        for _ in range(200):
            if recorder.embeds():
                break
            await asyncio.sleep(0.05)
        call_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call_task
        return recorder

    recorder = asyncio.run(scenario())
    assert recorder.statuses()[-1]["done"] is True and "keeps running" in recorder.statuses()[-1]["description"]
    [job] = jobs_of(service, "chat-c")
    assert job["state"] == "running"

    async def reattach_then_cancel():
        follower = Recorder()
        following = asyncio.create_task(tools.run_task_in_vm(
            task="slow job", **injected(tools.run_task_in_vm, follower, "chat-c", "m-2")))
        await asyncio.sleep(1.0)
        cancel_text = await tools.cancel_vm_job(**injected(tools.cancel_vm_job, Recorder(), "chat-c"))
        return await following, follower, cancel_text

    report, follower, cancel_text = asyncio.run(reattach_then_cancel())
    assert "already running in this chat" in follower.statuses()[0]["description"]
    assert "Stopped by a person" in report and "Stopped by a person" in cancel_text
    assert follower.statuses()[-1]["done"] is True
    assert len(jobs_of(service, "chat-c")) == 1


def test_a_refusing_service_gives_a_sentence_and_ends_the_status(service):
    module = load_tool()
    tools = module.Tools()
    tools.valves = module.Tools.Valves(service_url=service.url, service_token="wrong", poll_interval=0.2)
    text, recorder = call(tools.run_task_in_vm, "chat-x", task="anything")
    assert text.startswith("The VM agent service could not do that") and "401" in text
    assert recorder.statuses()[-1]["done"] is True


def test_real_worker_question_then_both_services_restart_and_the_same_session_finishes(tmp_path):
    """The real worker and loop, a real vmd (stand-in machine: commands run with bash in the
    project folder) and the scripted Ollama. With a real guest the same check would compare
    the guest's boot id; the stand-in has none, so the same vmd session is what is shown."""
    from tests.loop_harness import call as turn, user_texts
    from tests.ollama_server import start_ollama
    from tests.service_harness import REAL_WORKER, real_worker_env
    from tests.test_loop import PLAN, finish_script
    from tests.test_service_api import _stop_workers
    from tests.vmd_fakes import LocalMachines, make_config
    from vmd.rpc import VmdServer

    script = [PLAN, turn("run", {"command": "python3 --version"}),
              turn("ask_user", {"question": "Python 2 or 3?"}), *finish_script()[1:]]
    vmd_config = make_config(tmp_path / "vmd")
    with start_ollama(script) as server:
        # The stand-in hypervisor outlives vmd, as libvirt's guests do.
        machines = LocalMachines()
        vmd = VmdServer(vmd_config, machines).start()
        svc = ServiceProcess(tmp_path / "svc", worker_command=REAL_WORKER, vmd_socket=str(vmd_config.socket),
                             env=real_worker_env(server.url)).start()
        try:
            module = load_tool()
            tools = module.Tools()
            tools.valves = module.Tools.Valves(service_url=svc.url, service_token=SERVICE, poll_interval=0.2)
            text, recorder = call(tools.run_task_in_vm, "chat-r", task="write hello.py", project="hello")
            assert "Python 2 or 3?" in text and "answer_vm_question" in text, text
            # The preview opened once a command ran.
            assert recorder.embeds()[0]["replace"] is True and recorder.statuses()[-1]["done"] is True
            [waiting] = jobs_of(svc, "chat-r")

            svc.stop(kill=True)
            vmd.stop()
            vmd = VmdServer(vmd_config, machines).start()
            svc.start()

            report, recorder = call(tools.answer_vm_question, "chat-r", answer="3, please")
            [done] = jobs_of(svc, "chat-r")
            assert done["state"] == "done" and done["verification_passed"] is True, report
            assert report == done["report"] and done["session_id"] == waiting["session_id"]
            assert recorder.statuses()[-1] == {"description": "The VM agent finished.", "done": True}
            assert any("3, please" in t for t in user_texts(server.chat_requests[-1]))
        finally:
            svc.stop()
            _stop_workers(svc)
            vmd.stop()
