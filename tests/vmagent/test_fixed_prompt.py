"""The fixed prompt: the system prompt and the tool schemas, the head of every request of a
job. It is decided when the job starts, from what the image is (session_open's `desktop`,
`os_family`), and stays the same all job long; it is small enough that a model with 8k
tokens of context keeps 5k of them for its work. Counted with a real model's tokenizer
(SmolLM2's, in a real llama.cpp server: tests/support/llamacpp_server.py) on the two wire forms the
backends send (Ollama's client's, vmagent/models/ollama/wire.py; OpenAI's, vmagent/models/openai/wire.py)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.llamacpp_server import LlamaCppServer, start_llamacpp
from tests.support.loop_harness import running_vmd, sent_tool_names, user_texts
from tests.support.ollama_server import start_ollama
from tests.vmagent.loop.test_loop import finish_script, run
from vmagent.config import AgentConfig
from vmagent.loop import JobSpec, run_job
from vmagent.models.openai.wire import request_body
from vmagent.prompts import load_prompts
from vmagent.tools import SCREEN_TOOLS, offered_names, offered_schemas
from vmagent.models.ollama.wire import wire_tools

# What the fixed prompt may cost at most, and what a job on an 8k model must keep for its work.
FIXED_TOKENS = 3000
CONTEXT = 8192
WORK_TOKENS = 5000


def system_of(body: dict) -> str:
    return body["messages"][0]["content"]


# --- decided at the start, the same all job long -----------------------------------------


def test_a_guest_whose_image_has_no_desktop_is_offered_no_screen_tool_all_job_long(tmp_path):
    with running_vmd(tmp_path, desktop=False) as vmd, start_ollama(finish_script()) as server:
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "done", outcome.reason
    requests = server.chat_requests
    assert len(requests) >= 5
    # The same tool list and the same system prompt in every request, planning to finish:
    # none of the screen's tools or rules, which cost every request tokens for nothing.
    assert all(sent_tool_names(r) == offered_names((), screen=False) for r in requests)
    assert not set(SCREEN_TOOLS) & set(sent_tool_names(requests[0])) and "run" in sent_tool_names(requests[0])
    assert all(system_of(r) == system_of(requests[0]) for r in requests)
    assert "# The screen" not in system_of(requests[0])
    opening = user_texts(requests[0])[0]
    assert "screenshot" not in opening
    handover = user_texts(requests[1])[-1]
    assert "It has no desktop." in handover and "screenshot" not in handover


def test_an_image_with_a_desktop_has_the_screen_in_the_system_prompt_from_the_first_turn(tmp_path):
    with running_vmd(tmp_path, desktop=True) as vmd, start_ollama(finish_script()) as server:
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "done", outcome.reason
    requests = server.chat_requests
    assert "# The screen" in system_of(requests[0])
    assert all(sent_tool_names(r) == offered_names((), screen=True) for r in requests)
    assert all(system_of(r) == system_of(requests[0]) for r in requests)
    # The rules are in the head already: the hand-over does not say them again.
    assert "# The screen" not in "\n".join(user_texts(requests[1]))


def test_a_vmd_that_does_not_say_gets_every_tool_and_the_rules_with_the_hand_over(tmp_path):
    # desktop None: an older vmd, or an image it does not have yet. Nothing is taken away.
    with running_vmd(tmp_path, desktop=None) as vmd, start_ollama(finish_script()) as server:
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "done", outcome.reason
    assert sent_tool_names(server.chat_requests[0]) == offered_names((), screen=True)
    assert "# The screen" not in system_of(server.chat_requests[0])


def test_the_offered_schemas_leave_out_vmds_guard_bounds_but_keep_what_a_model_chooses():
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in offered_schemas("linux", (), True)}
    text = json.dumps(schemas)
    assert "maxLength" not in text and "maxItems" not in text and "131072" not in text
    # What a model picks from stays: enums, the required fields, a range that is a real choice.
    assert schemas["click"]["properties"]["button"]["enum"] == ["left", "right", "middle"]
    assert schemas["run"]["required"] == ["command"]
    assert schemas["finish"]["properties"]["verification"]["properties"]["expect_exit"]["maximum"] == 255
    # A default and a maximum said in the field's words are not said twice.
    timeout = schemas["run"]["properties"]["timeout"]
    assert "default 300" in timeout["description"] and "default" not in timeout and "maximum" not in timeout


# --- counted by a real tokenizer --------------------------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> LlamaCppServer:
    with start_llamacpp(tmp_path_factory.mktemp("llamacpp"), ctx=CONTEXT) as running:
        yield running


def tokens(server: LlamaCppServer, text: str) -> int:
    base = server.base_url.rsplit("/v1", 1)[0]  # llama.cpp's own /tokenize, beside /v1
    reply = httpx.post(base + "/tokenize", json={"content": text}, timeout=60)
    reply.raise_for_status()
    return len(reply.json()["tokens"])


@pytest.mark.parametrize("os_family,desktop", [("linux", False), ("linux", True), ("windows", True)])
@pytest.mark.parametrize("wire", ["ollama", "openai"])
def test_the_fixed_prompt_is_at_most_3k_tokens_of_a_real_tokenizer(llama, os_family, desktop, wire):
    system = load_prompts(os_family, desktop=desktop).system
    schemas = offered_schemas(os_family, (), screen=desktop)
    sent = (wire_tools(schemas) if wire == "ollama" else
            request_body("m", [], schemas, max_tokens=None, think=None)["tools"])
    counted = tokens(llama, system) + sum(tokens(llama, json.dumps(tool)) for tool in sent)
    assert counted <= FIXED_TOKENS, f"{os_family} desktop={desktop} over {wire}'s wire: {counted} tokens"


def test_a_job_on_an_8k_context_model_keeps_5k_tokens_for_its_work(tmp_path, llama):
    # A real job's first request, through the OpenAI-compatible backend to the real server:
    # the system prompt, the task and every tool of a Linux guest with a desktop, in the
    # server's own chat template. What the server counted is what the job has left.
    config = AgentConfig(model_api="openai", model_url=llama.base_url, model=llama.model, retries=0,
                         retry_backoff_s=0.2, request_timeout_s=120, max_steps=1, vmd_reconnect_s=5,
                         model_extra_body={"temperature": 0, "max_tokens": 8})
    with running_vmd(tmp_path, desktop=True) as vmd:
        outcome = run_job(JobSpec(task="Write hello.py that prints hello, with a test.", project="hello"),
                          on_event=lambda e: None, transcript_path=tmp_path / "job" / "transcript.json",
                          config=config, vmd_socket=vmd.socket)
    prompt = int(outcome.usage.get("prompt_tokens") or 0)
    assert prompt > 1000, outcome  # the request was made and counted
    assert CONTEXT - prompt >= WORK_TOKENS, f"the first request took {prompt} of {CONTEXT} tokens"

