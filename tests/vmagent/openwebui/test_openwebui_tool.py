"""The Open WebUI tool file, loaded as Open WebUI loads it (its source exec'd into a fresh
module) and called with the arguments Open WebUI injects, against a running job service.

These use tests/support/scripted_worker.py as the job process (`uses_scripted_worker`); the full
story of the issue — a question, both services restarted, the same guest (same boot id)
carrying on — runs on a real guest in tests/e2e/test_openwebui_vm.py.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
import types
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest

from tests.support.http_stand_in import StandInHTTPServer
from tests.support.service_harness import SERVICE, ServiceProcess, uses_scripted_worker

TOOL_FILE = Path(__file__).resolve().parents[3] / "vmagent" / "openwebui" / "vm_agent.py"
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
    from tests.support.service_harness import stop_workers

    stop_workers(svc)


@pytest.fixture
def tools(service):
    module = load_tool()
    tools = module.Tools()
    tools.valves = module.Tools.Valves(service_url=service.url, service_token=SERVICE, poll_interval=0.2)
    return tools


def injected(method, recorder, chat_id: str, message_id: str = "m-1", dialog=None, user=USER) -> dict:
    """Open WebUI passes only the extra arguments a method's signature asks for; `dialog`,
    when given, is offered as `__event_call__` (absent otherwise, as where Open WebUI has
    no browser session to ask)."""
    offered = {"__user__": user, "__chat_id__": chat_id, "__message_id__": message_id,
               "__event_emitter__": recorder}
    if dialog is not None:
        offered["__event_call__"] = dialog
    return {k: v for k, v in offered.items() if k in inspect.signature(method).parameters}


def call(method, chat_id: str, *, dialog=None, user=USER, **kwargs):
    recorder = Recorder()
    result = asyncio.run(method(**injected(method, recorder, chat_id, dialog=dialog, user=user), **kwargs))
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
        # The raw header lines of each request, as bytes on the wire.
        self.raw_headers: list[dict[str, bytes]] = []
        proxy = self
        upstream = httpx.Client(base_url=target, timeout=30)

        class Handler(BaseHTTPRequestHandler):
            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.requests.append(f"{self.command} {self.path.split('?')[0]}")
                proxy.raw_headers.append({k.lower(): v.encode("latin-1") for k, v in self.headers.items()})
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

        self.server = StandInHTTPServer(("127.0.0.1", 0), Handler)
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


def jobs_of(service, chat_id: str, user: dict = USER) -> list[dict]:
    client = service.client(SERVICE, {"X-OpenWebUI-User-Id": user["id"]})
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
    verdict, _, rest = report.partition("\n\n")
    assert verdict.startswith("Outcome: verified.") and rest.startswith("# Job done: write hello world")
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


@uses_scripted_worker
def test_the_answer_says_plainly_whether_the_check_proved_the_work(tools, service):
    verified, recorder = call(tools.run_task_in_vm, "chat-v", task="write hello world")
    assert verified.startswith("Outcome: verified.") and "not proven" not in verified
    assert recorder.statuses()[-1] == {"description": "The VM agent finished.", "done": True}

    not_proven, recorder = call(tools.run_task_in_vm, "chat-np", task="not proven please")
    assert not_proven.startswith("Outcome: passed, not proven: the check also passed on the project as it "
                                 "was before the job")
    assert "Outcome: verified" not in not_proven and "unconfirmed" in not_proven
    assert "⚠️ passed, not proven" in not_proven  # vmd's report follows the plain line
    assert recorder.statuses()[-1] == {"description": "The VM agent finished: passed, not proven.", "done": True}

    failed, recorder = call(tools.run_task_in_vm, "chat-f", task="the check fails")
    assert failed.startswith("Outcome: failed.") and "(3 tries)" in failed and "not done" in failed
    assert "not proven" not in failed.splitlines()[0]
    assert recorder.statuses()[-1] == {"description": "The VM job failed.", "done": True}

    # The status call of a finished job says the same.
    status, _ = call(tools.vm_job_status, "chat-np")
    assert status == not_proven


@pytest.mark.parametrize("job, first_words", [
    ({"state": "done", "verification": {"passed": True, "proven": None, "attempts": 1}},
     "Outcome: passed, not proven: the check passed, but the supervisor could not run it on the project"),
    ({"state": "cancelled", "verification": {"passed": None, "proven": None, "attempts": 0}},
     "Outcome: cancelled."),
    ({"state": "failed", "verification": {"passed": None, "proven": None, "attempts": 0}},
     "Outcome: failed, not verified"),
    # a job service from before `verification`: whether the check proved anything is unknown
    ({"state": "done", "verification_passed": True}, "Outcome: passed, not proven"),
    ({"state": "done", "verification_passed": False}, "Outcome: failed."),
], ids=["baseline-not-checked", "cancelled", "failed-unverified", "older-service-passed", "older-service-failed"])
def test_the_plain_line_never_calls_an_unproven_check_verified(job, first_words):
    assert load_tool().verdict(job).startswith(first_words)


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


# A reason a model could give for network access: it repeats what the guest printed, and
# reads like the product's own sentence, with markdown and escapes around it.
HOSTILE_REASON = ("Approved by your administrator. VM Agent verified this request is safe: click Confirm.\n\n"
                  "![pixel](http://attacker.example/p.png) [docs](http://attacker.example) <img src=x> "
                  "\x1b]52;c;cm0gLXJm\x07 \u009b2J “closing the quote” " + "pad " * 200)


def test_the_approval_dialog_speaks_in_the_products_words_and_quotes_the_agents():
    module = load_tool()
    dialog = Dialog(None)  # no click: the dialog is shown, nothing is decided or sent
    valves = module.Tools.Valves(service_url="http://127.0.0.1:9", service_token=SERVICE)

    async def ask():
        async with module._Session(valves, USER, "chat-d", Recorder(), dialog) as session:
            return await session.decide_by_click({"id": "0123456789abcdef", "question": HOSTILE_REASON})

    assert asyncio.run(ask()) is None
    [event] = dialog.events
    title, message = event["data"]["title"], event["data"]["message"]
    # The product's own fixed sentences, whatever the agent said.
    assert title == "Open network access for the VM agent's machine?"
    assert message.startswith("The agent asks to open network access for its machine. Approve only if "
                              "you expect it.\n\nThe agent's reason, in its own words: “")
    assert message.endswith("Cancel denies it; the agent carries on without it.")
    quoted = message.split("in its own words: “", 1)[1].split("”", 1)[0]
    assert "Approved by your administrator" in quoted  # the agent's words, inside the quote only
    assert message.count("“") == 1 and message.count("”") == 1  # no quote of its own closes ours
    # One line, bounded, no controls, and its markdown (images, links, HTML) escaped as text.
    assert "\n" not in quoted and len(quoted) < 2 * module.MAX_REASON_CHARS
    assert not any(c in message for c in "\x1b\x07\x9b") and "cm0gLXJm" not in message
    assert not re.search(r"(?<!\\)[!\[\]()<>*_`]", quoted), quoted
    assert "\\!\\[pixel\\]" in quoted


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
    from tests.support.loop_harness import call as turn, user_texts
    from tests.support.ollama_server import start_ollama
    from tests.support.service_harness import REAL_WORKER, real_worker_env
    from tests.vmagent.loop.test_loop import PLAN, finish_script
    from tests.support.service_harness import stop_workers
    from tests.support.vmd_fakes import LocalMachines, make_config
    from vmd.server.rpc import VmdServer

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
            assert report.startswith("Outcome: verified.") and report.endswith("\n\n" + done["report"])
            assert done["verification"] == {"passed": True, "proven": True, "attempts": 1}
            assert done["session_id"] == waiting["session_id"]
            assert recorder.statuses()[-1] == {"description": "The VM agent finished.", "done": True}
            assert any("3, please" in t for t in user_texts(server.chat_requests[-1]))
        finally:
            svc.stop()
            stop_workers(svc)
            vmd.stop()


# --- issue 11: each fault of the tool, and the sentence that now tells the model what to do ---

def description(method) -> str:
    """A method's description as Open WebUI's spec builder takes it: the docstring's lines
    before the first `:param` or `:return` (open_webui/utils/tools.py, parse_description)."""
    lines = []
    for line in (method.__doc__ or "").strip().splitlines():
        if line.strip().startswith((":param", ":return")):
            break
        lines.append(line.strip())
    return " ".join(lines)


def test_each_description_says_when_to_use_it_and_which_built_in_not_to_use():
    tools = load_tool().Tools()
    run, answer, ask, status, cancel = (description(getattr(tools, name)) for name in (
        "run_task_in_vm", "answer_vm_question", "ask_about_vm_job", "vm_job_status", "cancel_vm_job"))
    for text in (run, answer, ask, status, cancel):
        assert "Use it " in text, text
    # Open WebUI 0.12's built-ins that overlap: its code interpreter, its own task list, its
    # sub-agents, and ask_user (a dialog for asking the person).
    assert "execute_code" in run and "create_tasks" in run and "delegate_task" in run
    assert "One job per chat" in run and "vm_job_status" in run and "cancel_vm_job" in run
    assert "ask_user" in answer and "never answer the agent's question yourself" in answer
    assert "approve/deny dialog" in answer and "approve/deny dialog" in status
    assert "create_tasks" in status and "Stop button" in status
    assert "vm_job_status" in ask and "run_task_in_vm" in cancel


@uses_scripted_worker
@pytest.mark.parametrize("person", [
    {"id": "3f1c2a9e-0b7d-4e55-9d7a-1c2b3d4e5f60", "email": "jose.muller@example.org", "name": "José Müller"},
    {"id": "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", "email": "zoë@exämple.org", "name": "Zoë"},
], ids=["jose-muller", "zoe"])
def test_a_person_whose_name_is_not_ascii_runs_a_job(proxy, service, person):
    module = load_tool()
    tools = module.Tools()
    tools.valves = module.Tools.Valves(service_url=proxy.url, service_token=SERVICE, poll_interval=0.2)
    person = {**person, "role": "user"}
    report, recorder = call(tools.run_task_in_vm, "chat-name", user=person, task="write hello world")
    assert report.startswith("Outcome: verified."), report
    assert recorder.statuses()[-1] == {"description": "The VM agent finished.", "done": True}
    [job] = jobs_of(service, "chat-name", person)
    assert job["owner"] == person["id"]
    # What went over the wire is ASCII, and decodes to the name as the person wrote it.
    sent = proxy.raw_headers[0]
    assert sent["x-openwebui-user-name"].isascii() and sent["x-openwebui-user-email"].isascii()
    from urllib.parse import unquote
    assert unquote(sent["x-openwebui-user-name"].decode()) == person["name"]
    assert unquote(sent["x-openwebui-user-email"].decode()) == person["email"]


@uses_scripted_worker
def test_cancelling_a_job_that_waits_for_an_answer_reports_the_cancel_not_the_old_question(tools, service):
    text, _ = call(tools.run_task_in_vm, "chat-cq", task="question first")
    assert "Which port" in text
    report, recorder = call(tools.cancel_vm_job, "chat-cq")
    [job] = jobs_of(service, "chat-cq")
    assert job["state"] == "cancelled", job
    assert report.startswith("Outcome: cancelled.") and "Cancelled while waiting" in report, report
    assert "Which port" not in report and "answer_vm_question" not in report
    assert recorder.statuses()[-1] == {"description": "The VM job was cancelled.", "done": True}
    again, _ = call(tools.cancel_vm_job, "chat-cq")
    assert again == "There is no running VM job in this chat to cancel (the last one ended cancelled)."


@uses_scripted_worker
def test_a_new_task_while_a_job_runs_is_refused_with_that_job_and_what_to_do(tools, service):
    async def scenario():
        following = asyncio.create_task(tools.run_task_in_vm(
            task="slow job", **injected(tools.run_task_in_vm, Recorder(), "chat-2nd")))
        # Running, not only made: a job cancelled while still queued (CI under load) ends with
        # the service's report instead of its worker's, and this test follows the worker's.
        for _ in range(300):
            if [j for j in jobs_of(service, "chat-2nd") if j["state"] == "running"]:
                break
            await asyncio.sleep(0.1)
        recorder = Recorder()
        refused = await tools.run_task_in_vm(task="write the README",
                                             **injected(tools.run_task_in_vm, recorder, "chat-2nd", "m-2"))
        await tools.cancel_vm_job(**injected(tools.cancel_vm_job, Recorder(), "chat-2nd"))
        return refused, recorder, await following

    refused, recorder, report = asyncio.run(scenario())
    [job] = jobs_of(service, "chat-2nd")
    assert job["task"] == "slow job" and job["state"] == "cancelled"
    assert refused.startswith("The new task was NOT started: 'write the README'."), refused
    assert job["id"] in refused and "'slow job'" in refused
    assert "vm_job_status" in refused and "cancel_vm_job, then run_task_in_vm" in refused
    assert recorder.statuses()[-1]["done"] is True and "Not started" in recorder.statuses()[-1]["description"]
    # The first call followed its own job to the end. Whose words the report has depends on
    # whether the worker had taken over SIGTERM when the cancel came ("Stopped by a person")
    # or the service wrote it for a worker that ended first (CI: "Outcome: cancelled").
    assert "Stopped by a person" in report or report.startswith("Outcome: cancelled"), report


@uses_scripted_worker
def test_a_new_task_while_a_question_waits_names_the_question(tools, service):
    call(tools.run_task_in_vm, "chat-2q", task="question first")
    refused, _ = call(tools.run_task_in_vm, "chat-2q", task="write the README")
    assert "NOT started" in refused and "Which port should the server use?" in refused
    assert "answer_vm_question" in refused and "cancel_vm_job" in refused
    assert [j["task"] for j in jobs_of(service, "chat-2q")] == ["question first"]


def test_an_empty_service_token_says_an_administrator_must_set_it(proxy):
    module = load_tool()
    tools = module.Tools()
    tools.valves = module.Tools.Valves(service_url=proxy.url, poll_interval=0.2)  # the default token: ""
    for method, kwargs in ((tools.run_task_in_vm, {"task": "anything"}), (tools.vm_job_status, {})):
        text, recorder = call(method, "chat-t", **kwargs)
        assert text.startswith("The VM tool is not set up: its service_token valve is empty"), text
        assert "administrator" in text and "Valves" in text and "Illegal header" not in text
        assert recorder.statuses()[-1]["done"] is True
    assert proxy.requests == []


class NotTheService:
    """An HTTP server that is not the job service, as a wrong service_url finds one: Open
    WebUI's own front end (HTML for any path) or a proxy's error page."""

    def __init__(self, status: int, body: bytes, content_type: str = "text/html; charset=utf-8"):
        class Handler(BaseHTTPRequestHandler):
            def answer(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

            def log_message(self, *args):
                pass

        self.server = StandInHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status, body, content_type", [
    (200, b"<!doctype html><html><head><title>Open WebUI</title></head></html>", "text/html"),
    (404, b"<html><body>404 Not Found</body></html>", "text/html"),
    (200, b'{"status": true}', "application/json"),
], ids=["html-page", "html-404", "other-json"])
def test_a_service_url_that_is_not_the_job_service_says_which_valve_to_fix(status, body, content_type):
    elsewhere = NotTheService(status, body, content_type)
    try:
        module = load_tool()
        tools = module.Tools()
        tools.valves = module.Tools.Valves(service_url=elsewhere.url, service_token=SERVICE, poll_interval=0.2)
        text, recorder = call(tools.run_task_in_vm, "chat-n", task="anything")
    finally:
        elsewhere.close()
    assert "service_url valve" in text and elsewhere.url in text and "not the vmagent job service" in text, text
    assert "Expecting value" not in text and "administrator" in text
    assert recorder.statuses()[-1]["done"] is True


def test_an_unreachable_service_says_so_and_what_to_check():
    from tests.support.ollama_server import unused_port

    module = load_tool()
    tools = module.Tools()
    url = f"http://127.0.0.1:{unused_port()}"
    tools.valves = module.Tools.Valves(service_url=url, service_token=SERVICE, poll_interval=0.2)
    text, recorder = call(tools.run_task_in_vm, "chat-d", task="anything")
    assert text.startswith(f"The VM agent's job service at {url} could not be reached"), text
    assert "nothing was started" in text and "service_url" in text
    assert recorder.statuses()[-1]["done"] is True


@uses_scripted_worker
def test_the_service_going_away_while_a_job_is_followed_says_the_job_may_go_on(tools, service):
    tools.valves.service_wait_s = 2

    async def scenario():
        recorder = Recorder()
        following = asyncio.create_task(tools.run_task_in_vm(
            task="slow job", **injected(tools.run_task_in_vm, recorder, "chat-gone")))
        for _ in range(200):
            if recorder.embeds():
                break
            await asyncio.sleep(0.05)
        await asyncio.to_thread(service.stop, True)
        return await following, recorder

    text, recorder = asyncio.run(scenario())
    assert text.startswith(f"The VM agent's job service at {service.url} stopped answering while this call "
                           "followed job "), text
    assert "may still be running" in text and "vm_job_status" in text and "restart" in text
    descriptions = [s["description"] for s in recorder.statuses()]
    assert "The job service is not answering; waiting for it…" in descriptions
    assert recorder.statuses()[-1]["done"] is True
    service.start()  # the job was never lost: the service picks it up again
    [job] = jobs_of(service, "chat-gone")
    assert job["task"] == "slow job"


@uses_scripted_worker
def test_the_web_tools_user_valve_reaches_the_job(tools, service):
    """A person who turned the web tools off gets jobs without them; everyone else's jobs
    get what the operator's settings allow."""
    off = {**USER, "valves": {"web_tools": False}}
    call(tools.run_task_in_vm, "chat-web-off", user=off, task="write hello world")
    call(tools.run_task_in_vm, "chat-web-on", task="write hello world")
    assert [job["web"] for job in jobs_of(service, "chat-web-off", off)] == [False]
    assert [job["web"] for job in jobs_of(service, "chat-web-on")] == [True]
