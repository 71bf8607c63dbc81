"""The Open WebUI tool file, loaded as Open WebUI loads it (its source exec'd into a fresh
module) and called with the arguments Open WebUI injects, against a running job service.

These use tests/scripted_worker.py as the job process (`uses_scripted_worker`); the full
story of the issue — a question, both services restarted, the same guest (same boot id)
carrying on — runs on a real guest in tests/test_openwebui_vm.py.
"""

from __future__ import annotations

import asyncio
import inspect
import types
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


def injected(method, recorder, chat_id: str, message_id: str = "m-1") -> dict:
    """Open WebUI passes only the extra arguments a method's signature asks for."""
    offered = {"__user__": USER, "__chat_id__": chat_id, "__message_id__": message_id,
               "__event_emitter__": recorder}
    return {k: v for k, v in offered.items() if k in inspect.signature(method).parameters}


def call(method, chat_id: str, **kwargs):
    recorder = Recorder()
    result = asyncio.run(method(**injected(method, recorder, chat_id), **kwargs))
    return result, recorder


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


@uses_scripted_worker
def test_an_approval_is_given_with_a_plain_yes(tools):
    text, _ = call(tools.run_task_in_vm, "chat-u", task="unfreeze please")
    assert "asks for approval" in text and "the package index" in text
    report, _ = call(tools.answer_vm_question, "chat-u", answer="Yes, go ahead")
    assert "approved=True" in report


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
