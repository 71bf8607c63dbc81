"""The OpenAI-compatible model client against a real llama.cpp server (tests/support/llamacpp_server.py:
xllamacpp serving SmolLM2-135M on 127.0.0.1, two threads). The model is far too small to do a
job; these tests prove the wire: what a real inference server sends reaches the loop's types."""

from __future__ import annotations

import json
import random
import string
import threading
import time

import httpx
import pytest

from tests.support.llamacpp_server import LlamaCppServer, start_llamacpp
from tests.support.ollama_server import Turn
from tests.support.openai_server import start_openai
from vmagent import tools
from vmagent.config import AgentConfig
from vmagent.loop.compact import COMPACTED_HEADER, Compactor, PinnedContext
from vmagent.models import ContextTooLong, open_model
from vmagent.models.openai import OpenAICompatModel
from vmagent.models.openai.stream import OpenAIEvents
from vmagent.models.openai.wire import request_body
from vmagent.models.stream import ReplyStream
from vmd.contract.params import Run

CONTEXT = 2048
# The run tool as vmd's contract has it, less the bounds: a schema's maxLength of 131072
# becomes a grammar rule llama.cpp walks at every token (15 s for one call here, against
# 1.5 s without it).
RUN_TOOL = {"type": "function", "function": {
    "name": "run", "description": "Run a bash command line in the guest.",
    "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "description": "The bash command line to run."}}, "required": ["command"]}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> LlamaCppServer:
    with start_llamacpp(tmp_path_factory.mktemp("llamacpp"), ctx=CONTEXT) as running:
        yield running


def config_for(server: LlamaCppServer, **overrides) -> AgentConfig:
    # temperature 0: the same reply every run.
    values = dict(model_api="openai", model_url=server.base_url, model=server.model, retry_backoff_s=0.2,
                  request_timeout_s=60, model_extra_body={"temperature": 0})
    values.update(overrides)
    return AgentConfig(**values)


def test_a_streamed_chat_reaches_the_loop_as_a_reply_with_token_counts(server):
    model = open_model(config_for(server))
    assert isinstance(model, OpenAICompatModel)
    shown: list[str] = []
    reply = model.chat([{"role": "user", "content": "Say hello to the person."}], max_tokens=16, on_text=shown.append)

    assert reply.content.strip() and "".join(shown) == reply.content
    assert len(shown) > 1  # streamed, piece by piece
    assert reply.prompt_eval_count and reply.prompt_eval_count > 5
    assert reply.eval_count and 0 < reply.eval_count <= 16
    assert reply.done_reason in ("stop", "length")
    # What the server said about itself: its context, not the num_ctx default.
    assert model.context_length() == CONTEXT


def test_a_constrained_tool_call_reaches_the_loop_as_a_call_vmds_contract_accepts(server):
    # tool_choice "required": llama.cpp's grammar holds the reply to a call of the tools
    # offered; the last assistant message starts the reply at the call's tag (llama.cpp
    # continues it), where the tiny model would otherwise talk first.
    config = config_for(server, model_extra_body={"temperature": 0, "tool_choice": "required"})
    model = open_model(config)
    messages = [
        {"role": "system", "content": "You are an agent that works through tools."},
        {"role": "user", "content": "List the files in /tmp."},
        {"role": "assistant", "content": "<tool_call>\n"},
    ]
    reply = model.chat(messages, tools=[RUN_TOOL], max_tokens=40)  # one call is ~26 tokens

    assert reply.tool_calls, reply
    first = reply.tool_calls[0]
    assert first.name == "run" and first.id
    assert isinstance(first.arguments, dict)
    Run.model_validate(first.arguments)  # vmd's contract model takes it as it came
    parsed = tools.parse_arguments("run", first.arguments)
    assert parsed.ok and parsed.params["command"] == first.arguments["command"]
    # The history keeps the server's id, and it goes back as the result's tool_call_id.
    assert reply.as_message()["tool_calls"][0]["id"] == first.id


def _random_words(rng: random.Random, chars: int) -> str:
    alphabet = string.ascii_letters + string.digits + "+/=_-"
    return "".join(rng.choice(alphabet) for _ in range(chars))


def test_a_prompt_longer_than_the_context_takes_the_compaction_path(server):
    # max_tokens in the body, a ceiling for every reply: the loop's own requests set none,
    # and the tiny model would write to the end of the context (1016 tokens, 76 s here), and
    # the summary asks for ~300 (2 tokens/s here beside three TCG guests: 120 s).
    config = config_for(server, keep_tail_messages=2, model_extra_body={"temperature": 0, "max_tokens": 24})
    model = open_model(config)
    # Random characters: ~1.2 per token for SmolLM2's tokenizer (4002 tokens here), where the
    # estimate assumes 4, so the estimate says the history fits (under 70% of 2048) and the
    # server finds it does not fit at all.
    rng = random.Random(7)
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Read the logs."}]
    for n in range(4):
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "read_file", "arguments": {"path": f"/var/log/part{n}.log"}}}]},
            {"role": "tool", "tool_name": "read_file", "content": _random_words(rng, 1150)},
        ]
    compactor = Compactor(config, model)
    assert compactor.estimate(messages) < compactor.target

    with pytest.raises(ContextTooLong) as refused:
        model.chat(messages, max_tokens=8)
    assert refused.value.prompt_tokens and refused.value.prompt_tokens > CONTEXT

    sent, reply, compacted = compactor.ask(messages, None, PinnedContext(task_list="1. read the logs"))
    assert compacted
    assert any(str(m.get("content", "")).startswith(COMPACTED_HEADER) for m in sent)
    assert sent[:2] == messages[:2]  # the system prompt and the task survive
    assert reply.prompt_eval_count and reply.prompt_eval_count < CONTEXT
    assert compactor.history and compactor.history[-1].summarised_messages > 0


class _FirstBytes(httpx.HTTPTransport):
    """Sets `seen` when the first bytes of the first chat stream arrive: the moment to kill
    the server mid-stream."""

    def __init__(self, seen: threading.Event):
        super().__init__()
        self.seen = seen

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith("/chat/completions") and not self.seen.is_set():
            inner, seen = response.stream, self.seen

            class Watched(httpx.SyncByteStream):
                def __iter__(self):
                    for chunk in inner:
                        seen.set()
                        yield chunk

                def close(self) -> None:
                    inner.close()

            response.stream = Watched()
        return response


def test_the_server_killed_mid_stream_is_asked_again_and_answers_once(server):
    seen = threading.Event()
    config = config_for(server, retries=20, retry_backoff_s=0.3, model_retry_s=120)
    model = OpenAICompatModel(config, transport=_FirstBytes(seen))
    model.capabilities()
    restarted: list[float] = []

    def crash_and_restart() -> None:
        if seen.wait(60):
            server.kill()
            began = time.monotonic()
            server.start()  # the same port
            restarted.append(time.monotonic() - began)

    killer = threading.Thread(target=crash_and_restart, daemon=True)
    killer.start()
    # No watcher: nothing was shown when the stream broke, so the request is asked again.
    reply = model.chat([{"role": "user", "content": "Write a long story about a lighthouse."}], max_tokens=120)
    killer.join(60)

    assert restarted, "the server was never killed mid-stream"
    assert reply.content.strip() and reply.eval_count
    assert len(model.outages) == 1 and model.outages[0].back and model.outages[0].tries >= 2
    # Answered once: the reply is one answer, not the broken one and the next run together.
    counted = httpx.post(f"{server.url}/tokenize", json={"content": reply.content}).json()["tokens"]
    assert abs(len(counted) - reply.eval_count) <= 2


# --- the stand-in's stream against the real one ------------------------------------------


def _events(url: str, body: dict) -> list:
    """The chunks of one streamed response, parsed; "[DONE]" for the end marker."""
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        data = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def _calls(events: list) -> list[tuple[str, object]]:
    """The calls the client reads from these chunks."""
    stream = ReplyStream(None, None)
    read = OpenAIEvents(stream)
    for event in events:
        read.take_line("data: " + (event if event == "[DONE]" else json.dumps(event)))
        read.take_line("")
    return [(call.name, call.arguments) for call in stream.reply().tool_calls]


def _shape(events: list) -> dict:
    """What a client depends on in a stream, with the values left out."""
    order, per_call, keys = [], {}, set()
    for event in events:
        if event == "[DONE]":
            order.append("done")
            continue
        keys.add(tuple(sorted(set(event) - {"usage", "timings"})))  # timings: llama.cpp's own extra
        if not event["choices"]:
            order.append(("usage", tuple(sorted(k for k in event["usage"] if k.endswith("_tokens")))))
            continue
        choice = event["choices"][0]
        keys.add(("choice",) + tuple(sorted(choice)))
        delta = choice["delta"]
        if "role" in delta:
            order.append("role")
        elif delta.get("tool_calls"):
            piece = delta["tool_calls"][0]
            kind = ("start" if "id" in piece else "arguments", tuple(sorted(piece)), tuple(sorted(piece["function"])))
            calls = per_call.setdefault(piece["index"], [])
            if not calls or calls[-1] != kind:
                calls.append(kind)
            if not order or order[-1] != "calls":
                order.append("calls")
        elif choice.get("finish_reason"):
            order.append(("finish", tuple(sorted(delta))))
        elif delta.get("content"):
            order.append("content")
    collapsed = [kind for n, kind in enumerate(order) if n == 0 or order[n - 1] != kind]
    return {"order": collapsed, "calls": sorted(map(tuple, per_call.values())), "keys": keys}


def test_the_stand_ins_stream_has_the_real_servers_shape(server):
    messages = [{"role": "system", "content": "You are an agent that works through tools."},
                {"role": "user", "content": "List the files in /tmp."},
                {"role": "assistant", "content": "<tool_call>\n"}]
    body = request_body(server.model, messages, [RUN_TOOL], 60, None, {"temperature": 0, "tool_choice": "required"})
    real = _events(f"{server.base_url}/chat/completions", body)
    calls = _calls(real)
    assert calls and all(isinstance(arguments, dict) for _, arguments in calls), calls

    # The same calls, played by the stand-in for the same request.
    script = [Turn(tool_calls=[{"name": name, "arguments": arguments} for name, arguments in calls])]
    with start_openai(script, model_name=server.model) as stand_in:
        played = _events(f"{stand_in.base_url}/chat/completions", {**body, "model": stand_in.model_name})

    real_shape, played_shape = _shape(real), _shape(played)
    assert played_shape["order"] == real_shape["order"] == [
        "role", "calls", ("finish", ()), ("usage", ("completion_tokens", "prompt_tokens", "total_tokens")), "done"]
    # each call: a first delta with index, id, type, name and arguments, then arguments alone
    assert played_shape["calls"] == real_shape["calls"]
    assert real_shape["calls"][0] == (("start", ("function", "id", "index", "type"), ("arguments", "name")),
                                      ("arguments", ("function", "index"), ("arguments",)))
    assert played_shape["keys"] == real_shape["keys"]
    assert _calls(played) == calls
