"""The OpenAI-compatible model client against the stand-in server (tests/support/openai_server.py):
tool calls assembled from interleaved fragments, what is sent, capabilities, failures and
the key; and a whole job through the loop on it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from tests.support.loop_harness import agent_config, running_vmd
from tests.support.ollama_server import Turn, unused_port
from tests.support.openai_server import start_openai
from tests.vmagent.loop.test_loop import assert_closed_with_report, finish_script, run
from vmagent.config import AgentConfig, dump
from vmagent.models import ContextTooLong, ModelError, open_model
from vmagent.models.openai import OpenAICompatModel

TASK = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "List the files."}]
RUN_TOOL = {"type": "function", "function": {"name": "run", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
KEY = "sk-test-0123456789abcdef"


def config(server, **overrides) -> AgentConfig:
    values = dict(model_api="openai", model_url=server.base_url, model=server.model_name, retry_backoff_s=0.0,
                  request_timeout_s=10)
    values.update(overrides)
    return AgentConfig(**values)


def test_interleaved_fragmented_tool_calls_thinking_and_usage_reach_the_reply():
    turn = Turn(thinking="I should look first.", content="Looking.", chunk_chars=3, tool_calls=[
        {"name": "run", "arguments": {"command": "ls -la /mnt/project"}},
        {"name": "read_file", "arguments": {"path": "/mnt/project/README.md", "offset": 0}},
    ])
    with start_openai([turn], arguments_chunk_chars=4) as server:
        shown, thought = [], []
        reply = open_model(config(server)).chat(TASK, tools=[RUN_TOOL], on_text=shown.append,
                                                on_thinking=thought.append)
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [
        ("run", {"command": "ls -la /mnt/project"}),
        ("read_file", {"path": "/mnt/project/README.md", "offset": 0}),
    ]
    assert all(c.id and c.id.endswith(f"_{n}") for n, c in enumerate(reply.tool_calls))
    assert reply.thinking == "I should look first." and "".join(thought) == reply.thinking
    assert reply.content == "Looking." and len(shown) == 3
    assert reply.prompt_eval_count and reply.eval_count and reply.done_reason == "tool_calls"


def test_the_request_carries_tool_results_by_id_images_as_data_urls_and_asks_for_usage():
    history = TASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_a", "function": {"name": "screenshot", "arguments": {}}},
            {"function": {"name": "run", "arguments": '{"command": "ls"}'}},
            {"function": {"name": "finish", "arguments": {"summary": "x"}}}]},
        {"role": "tool", "tool_name": "screenshot", "content": "the screen", "images": ["iVBORw0KGgo="]},
        {"role": "tool", "tool_name": "run", "content": "exit 0"},
        {"role": "user", "content": "go on"},
    ]
    with start_openai(["ok"]) as server:
        open_model(config(server, model_key=KEY)).chat(history, tools=[RUN_TOOL], max_tokens=50)
    body = server.chat_requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 50 and body["tools"] == [RUN_TOOL] and body["model"] == server.model_name
    sent = body["messages"]
    calls = sent[2]["tool_calls"]
    assert calls[0]["id"] == "call_a" and calls[1]["function"]["arguments"] == '{"command": "ls"}'
    assert calls[2]["function"]["arguments"] == '{"summary": "x"}' and all(c["type"] == "function" for c in calls)
    # each result by its call's id; the call not run is answered, not left open
    assert [(m["role"], m["tool_call_id"]) for m in sent[3:6]] == [("tool", c["id"]) for c in calls]
    assert sent[5]["content"].startswith("(not run")
    # the screenshot follows the results, as a user message with a data URL
    image = sent[6]["content"][1]
    assert sent[6]["role"] == "user" and image == {"type": "image_url",
                                                   "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    assert sent[7] == {"role": "user", "content": "go on"}
    assert server.headers[-1]["Authorization"] == f"Bearer {KEY}"


def test_capabilities_and_context_come_from_v1_models_else_from_the_settings():
    with start_openai([], context=65536, vision=True) as server:
        model = open_model(config(server, num_ctx=8192))
        assert model.sees_images() and model.context_length() == 65536 and "tools" in model.capabilities()
    with start_openai(["fine"], list_models=False) as server:  # a server without /v1/models
        model = open_model(config(server, num_ctx=8192, model_vision=False))
        assert not model.sees_images() and model.context_length() == 8192
        assert model.chat(TASK).content == "fine"


def test_a_model_the_server_does_not_serve_is_said_with_the_ones_it_does():
    with start_openai([], model_name="served-model") as server:
        with pytest.raises(ModelError) as failed:
            open_model(config(server, model="other-model")).capabilities()
    assert "serves no model other-model; it serves served-model" in str(failed.value)
    assert "VMAGENT_MODEL" in str(failed.value)


def test_a_wrong_key_is_said_without_the_key_and_the_key_is_never_shown(caplog):
    caplog.set_level(logging.DEBUG)
    with start_openai([], key="the-right-one") as server:
        settings = config(server, model_key=KEY)
        with pytest.raises(ModelError) as failed:
            open_model(settings).capabilities()
    text = str(failed.value)
    assert "refused the key" in text and "VMAGENT_MODEL_KEY" in text and "401" in text
    for shown in (text, dump(settings), repr(settings), str(settings), caplog.text):
        assert KEY not in shown
    assert settings.model_key.get_secret_value() == KEY


def test_5xx_and_429_are_asked_again_and_a_400_says_the_servers_words():
    script = [Turn(status=503, error="no free slot"), Turn(status=429, error="busy"), "at last",
              Turn(status=400, error="'messages' must not be empty")]
    with start_openai(script) as server:
        model = open_model(config(server))
        assert model.chat(TASK).content == "at last"
        assert len(model.outages) == 1 and model.outages[0].tries == 3 and model.outages[0].back
        with pytest.raises(ModelError) as failed:
            model.chat(TASK)
    assert "HTTP 400: 'messages' must not be empty" in str(failed.value)
    assert len(server.chat_requests) == 4  # the 400 was not asked again


def test_a_prompt_past_the_context_is_context_too_long_with_the_servers_count():
    with start_openai(["never"], context=3000) as server:
        with pytest.raises(ContextTooLong) as refused:
            open_model(config(server)).chat([{"role": "user", "content": "x " * 10000}])
    assert refused.value.prompt_tokens and refused.value.prompt_tokens > 3000 and refused.value.context == 3000


def test_a_stream_cut_before_anything_was_shown_is_asked_again_and_after_is_not():
    with start_openai([Turn(content="lost", drop_after_chunks=2), "whole"]) as server:
        assert open_model(config(server)).chat(TASK).content == "whole"
    with start_openai([Turn(content="lost half", chunk_chars=2, drop_after_chunks=3), "whole"]) as server:
        with pytest.raises(ModelError) as failed:
            open_model(config(server)).chat(TASK, on_text=lambda piece: None)
    assert failed.value.streamed and "broke off" in str(failed.value)
    assert len(server.chat_requests) == 1


def test_an_unreachable_server_is_said_with_its_url_and_the_setting():
    settings = AgentConfig(model_api="openai", model_url=f"http://127.0.0.1:{unused_port()}/v1", retries=1,
                           retry_backoff_s=0.0)
    with pytest.raises(ModelError) as failed:
        OpenAICompatModel(settings).capabilities()
    assert settings.model_url in str(failed.value) and "VMAGENT_MODEL_URL" in str(failed.value)


def test_a_whole_job_runs_through_the_openai_protocol(tmp_path):
    with running_vmd(tmp_path) as vmd, start_openai(finish_script()) as server:
        settings = agent_config(server, model_api="openai", model_url=server.base_url, model=server.model_name)
        outcome = run(tmp_path, vmd, server, config=settings)
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    assert_closed_with_report(vmd, outcome)
    assert (vmd.project("hello") / "hello.py").read_text() == "print('hello')\n"
    # every tool result went back by the id of the call it answers
    last = server.chat_requests[-1]["messages"]
    ids = {c["id"] for m in last if m["role"] == "assistant" for c in m.get("tool_calls") or []}
    answered = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert answered and set(answered) <= ids


def test_a_job_on_an_openai_server_never_loads_the_ollama_client(tmp_path):
    # The loop reaches the model through vmagent.models alone, and a backend is imported
    # only when the settings choose it: a worker's every import, as -X importtime lists it.
    with running_vmd(tmp_path) as vmd, start_openai(finish_script()) as server:
        job_dir = tmp_path / "job"
        job_dir.mkdir()
        (job_dir / "job.json").write_text(json.dumps({
            "spec": {"task": "write hello.py", "project": "hello"}, "mode": "run", "vmd_socket": vmd.socket}))
        env = dict(os.environ, VMAGENT_MODEL_API="openai", VMAGENT_MODEL_URL=server.base_url,
                   VMAGENT_MODEL=server.model_name, VMAGENT_RETRIES="0", VMAGENT_SCREEN_WATCH_S="0")
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "vmagent.worker", "--job-dir", str(job_dir)],
                              env=env, capture_output=True, text=True, timeout=180)
    frames = [json.loads(line) for line in done.stdout.splitlines()]
    assert frames[-1]["type"] == "done" and frames[-1]["outcome"]["state"] == "done", frames[-1]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert {"vmagent.loop", "vmagent.models.openai.model"} <= imported  # the list is the worker's whole
    assert not [name for name in imported if name.split(".")[0] == "ollama" or name.startswith("vmagent.models.ollama")]


def test_the_job_service_passes_the_model_server_settings_to_its_workers():
    from vmagent.service.config import ServiceConfig
    from vmagent.service.worker_process import worker_environment

    environ = {"VMAGENT_MODEL_API": "openai", "VMAGENT_MODEL_URL": "http://gpu:8000/v1", "VMAGENT_MODEL_KEY": KEY,
               "VMAGENT_MODEL": "served", "VMAGENT_SERVICE_TOKEN": "not-for-workers"}
    env = worker_environment(ServiceConfig(service_token="t"), environ)
    assert {k: env[k] for k in environ if k in env} == {k: v for k, v in environ.items() if k != "VMAGENT_SERVICE_TOKEN"}
    settings = AgentConfig.load(env=env)
    assert settings.model_api == "openai" and settings.model_server() == "http://gpu:8000/v1"


def test_a_server_with_less_context_than_the_settings_say_is_compacted_to_its_own():
    # No /v1/models: the settings say 32768 tokens, the server has 3000. Its refusal says
    # so, and the history is compacted to fit what it has, then answered.
    from vmagent.loop.compact import COMPACTED_HEADER, Compactor, PinnedContext

    history = TASK + [m for n in range(6) for m in (
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "run", "arguments": {"command": f"cat log{n}"}}}]},
        {"role": "tool", "tool_name": "run", "content": f"line {n} " * 300})]
    with start_openai(["the summary of the logs", "answered"], list_models=False, context=3000) as server:
        settings = config(server, num_ctx=32768, keep_tail_messages=2)
        compactor = Compactor(settings, open_model(settings))
        sent, reply, compacted = compactor.ask(history, None, PinnedContext(task_list="1. read the logs"))
    assert compacted and reply.content == "answered"
    assert [r.outcome for r in server.requests if r.path.endswith("/completions")] == [
        "refused 400 context", "reply", "reply"]
    assert compactor.num_ctx == 3000 and server.requests[-1].prompt_eval_count <= 3000
    assert any(str(m.get("content", "")).startswith(COMPACTED_HEADER) for m in sent)


def test_questions_about_a_job_go_to_the_server_the_jobs_use(monkeypatch):
    from vmagent.service.ask import _ask_model
    from vmagent.service.config import ServiceConfig

    monkeypatch.delenv("VMAGENT_CONFIG", raising=False)
    with start_openai(["main.py was added"], key=KEY, model_name="asker") as server:
        for name, value in {"VMAGENT_MODEL_API": "openai", "VMAGENT_MODEL_URL": server.base_url,
                            "VMAGENT_MODEL_KEY": KEY}.items():
            monkeypatch.setenv(name, value)
        answer = _ask_model(ServiceConfig(ask_model="asker"), "What changed?", [("report", "main.py was added")])
    assert answer == "main.py was added"
    assert server.chat_requests[0]["model"] == "asker" and server.headers[-1]["Authorization"] == f"Bearer {KEY}"


def test_a_max_tokens_in_the_settings_caps_every_reply():
    with start_openai(["a", "b"]) as server:
        model = open_model(config(server, model_extra_body={"max_tokens": 100, "top_k": 20}))
        model.chat(TASK)
        model.chat(TASK, max_tokens=500)
    assert [(b["max_tokens"], b["top_k"]) for b in server.chat_requests] == [(100, 20), (100, 20)]
