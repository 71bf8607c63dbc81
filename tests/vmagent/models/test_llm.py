"""The model client against a real HTTP server speaking Ollama's protocol."""

from __future__ import annotations

import base64

import pytest

from tests.support.ollama_server import Turn, start_ollama, unused_port
from vmagent.config import AgentConfig
from vmagent.models import SCREENSHOT_DROPPED, Reply, drop_old_images
from vmagent.models import ModelError as OllamaError
from vmagent.models.ollama import OllamaModel as LLM

RUN_TOOL = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
TASK = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "List the files."}]


def make_llm(url: str, **overrides) -> LLM:
    settings = {"ollama_host": url, "retry_backoff_s": 0.0, "request_timeout_s": 10, **overrides}
    return LLM(AgentConfig(**settings))


def test_streaming_accumulates_text_thinking_and_tool_calls():
    turn = Turn(
        thinking="I should list the project folder first.",
        content="Listing the files now.",
        tool_calls=[{"name": "run", "arguments": {"command": "ls -la /mnt/project"}}],
        chunk_chars=5,
    )
    with start_ollama([turn]) as server:
        texts, thoughts = [], []
        reply = make_llm(server.url).chat(TASK, tools=[RUN_TOOL], on_text=texts.append, on_thinking=thoughts.append)

    assert reply.content == "Listing the files now."
    assert reply.thinking == "I should list the project folder first."
    assert len(texts) > 1 and "".join(texts) == reply.content
    assert len(thoughts) > 1 and "".join(thoughts) == reply.thinking
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("run", {"command": "ls -la /mnt/project"})]
    assert reply.done_reason == "stop"
    assert reply.prompt_eval_count and reply.prompt_eval_count > 0
    assert reply.eval_count and reply.eval_count > 0
    assert server.chat_requests[0]["stream"] is True
    assert server.chat_requests[0]["tools"][0]["function"]["name"] == "run"


def test_the_history_message_carries_tool_calls_but_not_thinking():
    reply = Reply(content="ok", thinking="secret", tool_calls=[{"name": "run", "arguments": {"command": "ls"}}])
    assert reply.as_message() == {
        "role": "assistant",
        "content": "ok",
        "tool_calls": [{"function": {"name": "run", "arguments": {"command": "ls"}}}],
    }


def test_num_ctx_and_keep_alive_are_sent_with_every_request():
    with start_ollama(["one", "two"]) as server:
        llm = make_llm(server.url, num_ctx=16384, keep_alive="45m")
        llm.chat(TASK)
        llm.chat(TASK + [{"role": "assistant", "content": "one"}], think=False, max_tokens=100)

    assert len(server.chat_requests) == 2
    for body in server.chat_requests:
        assert body["options"]["num_ctx"] == 16384
        assert body["keep_alive"] == "45m"
        assert body["model"] == "qwen3-vl:32b"
    assert server.chat_requests[1]["options"]["num_predict"] == 100


def test_think_is_sent_only_when_the_model_supports_it():
    with start_ollama(["a", "b"], capabilities=["completion", "tools", "thinking"]) as server:
        llm = make_llm(server.url)
        llm.chat(TASK)
        llm.chat(TASK, think=False)
        shows = [r for r in server.requests if r.path == "/api/show"]
    assert [b.get("think") for b in server.chat_requests] == [True, False]
    assert len(shows) == 1, "capabilities are asked once and cached"

    with start_ollama(["a", "b"], capabilities=["completion", "tools"]) as server:
        llm = make_llm(server.url, think=True)
        reply = llm.chat(TASK)
        llm.chat(TASK, think=False)
    assert reply.content == "a"
    assert all("think" not in body for body in server.chat_requests)


def test_a_500_before_streaming_is_retried():
    with start_ollama(["recovered"]) as server:
        server.fail_next(2, status=500)
        reply = make_llm(server.url).chat(TASK)
    assert reply.content == "recovered"
    assert [r.outcome for r in server.chats] == ["failed 500", "failed 500", "reply"]


def test_a_drop_before_anything_was_streamed_is_retried():
    with start_ollama(["dropped", "after the drop"]) as server:
        server.drop_next(after_chunks=0)
        texts = []
        reply = make_llm(server.url).chat(TASK, on_text=texts.append)
    assert reply.content == "after the drop"
    assert "".join(texts) == "after the drop", "nothing was shown twice"
    assert [r.outcome for r in server.chats] == ["dropped after 0 chunks", "reply"]


def test_no_retry_once_text_was_streamed():
    with start_ollama([Turn(content="This reply will be cut off in the middle.", chunk_chars=4, drop_after_chunks=3)]) as server:
        server.add("a retry would show this")
        texts = []
        with pytest.raises(OllamaError) as caught:
            make_llm(server.url).chat(TASK, on_text=texts.append)
    assert caught.value.streamed is True
    assert "after part of it was shown" in str(caught.value)
    assert server.url.split("//")[1] in str(caught.value)
    assert "".join(texts) == "This reply w"
    assert len(server.chats) == 1


def test_a_drop_mid_stream_is_retried_when_nothing_was_shown():
    turn = Turn(content="Nobody watches this reply.", chunk_chars=4, drop_after_chunks=3)
    with start_ollama([turn, "complete"]) as server:
        reply = make_llm(server.url).chat(TASK)
    assert reply.content == "complete"
    assert [r.outcome for r in server.chats] == ["dropped after 3 chunks", "reply"]


def test_a_reply_the_client_cannot_read_is_an_ollama_error():
    # Ollama sends arguments as an object; a string cannot pass the official client's model.
    turn = Turn(tool_calls=[{"function": {"name": "run", "arguments": '{"command": "ls"}'}}])
    with start_ollama([turn]) as server:
        with pytest.raises(OllamaError) as caught:
            make_llm(server.url).chat(TASK, tools=[RUN_TOOL])
    assert "cannot read" in str(caught.value) and server.url in str(caught.value)


def test_retries_end_in_an_ollama_error_naming_host_and_model():
    with start_ollama(["never"]) as server:
        server.fail_next(10, status=503, error="model runner crashed")
        with pytest.raises(OllamaError) as caught:
            make_llm(server.url, retries=2).chat(TASK)
    message = str(caught.value)
    assert len(server.chats) == 3
    assert server.url in message and "qwen3-vl:32b" in message and "model runner crashed" in message
    assert caught.value.status == 503


def test_an_unreachable_host_gives_an_ollama_error_with_the_host():
    host = f"http://127.0.0.1:{unused_port()}"
    with pytest.raises(OllamaError) as caught:
        make_llm(host, retries=1).chat(TASK)
    message = str(caught.value)
    assert host in message
    assert "OLLAMA_HOST" in message


def test_a_missing_model_says_how_to_pull_it():
    with start_ollama(["x"], models=["llama3.2"]) as server:
        with pytest.raises(OllamaError) as caught:
            make_llm(server.url, model="qwen3:32b").chat(TASK)
    assert "ollama pull qwen3:32b" in str(caught.value)
    assert caught.value.status == 404
    assert len(server.requests) == 1, "a missing model is not retried"


def test_a_4xx_is_not_retried():
    with start_ollama(["x"]) as server:
        server.fail_next(1, status=400, error="invalid options")
        with pytest.raises(OllamaError) as caught:
            make_llm(server.url).chat(TASK)
    assert "invalid options" in str(caught.value)
    assert len(server.chats) == 1


def test_a_failing_watcher_callback_does_not_break_the_reply():
    def broken(_piece):
        raise RuntimeError("renderer exploded")

    with start_ollama([Turn(content="still here", thinking="hm")]) as server:
        reply = make_llm(server.url).chat(TASK, on_text=broken, on_thinking=broken)
    assert reply.content == "still here"


def test_tool_call_arguments_kept_as_a_string_are_sent_back_as_an_object():
    history = TASK + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "run", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_name": "run", "content": "exit 0"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "run", "arguments": "ls -la"}}]},
        {"role": "tool", "tool_name": "run", "content": "arguments must be an object"},
    ]
    with start_ollama(["ok"]) as server:
        make_llm(server.url).chat(history, tools=[RUN_TOOL])
    sent = server.chat_requests[0]["messages"]
    assert sent[2]["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}
    assert sent[4]["tool_calls"][0]["function"]["arguments"] == {"_raw_arguments": "ls -la"}


def png(n: int) -> str:
    return base64.b64encode(b"\x89PNG fake screenshot %d" % n).decode()


def test_drop_old_images_keeps_only_the_newest():
    history = [
        {"role": "user", "content": "task"},
        {"role": "tool", "tool_name": "screenshot", "content": "shot 1", "images": [png(1)]},
        {"role": "tool", "tool_name": "screenshot", "content": "shot 2", "images": [png(2)]},
        {"role": "user", "content": "two at once", "images": [png(3), png(4)]},
    ]
    kept = drop_old_images(history, keep=2)
    assert [m.get("images") for m in kept] == [None, None, None, [png(3), png(4)]]
    assert kept[1]["content"] == f"shot 1\n{SCREENSHOT_DROPPED}"
    assert history[1]["images"] == [png(1)], "the caller's history is not changed"

    kept = drop_old_images(history, keep=3)
    assert [m.get("images") for m in kept] == [None, None, [png(2)], [png(3), png(4)]]
    kept = drop_old_images(history, keep=1)
    assert kept[3]["images"] == [png(4)] and SCREENSHOT_DROPPED in kept[3]["content"]


def test_no_more_than_max_images_screenshots_reach_the_model():
    # The loop drops old screenshots in batches (tests/vmagent/loop/test_prompt_prefix.py); the client
    # still never sends more than the ceiling, whatever history it is given.
    history = [{"role": "user", "content": "task"}] + [
        {"role": "user", "content": f"screen {n}", "images": [png(n)]} for n in range(5)
    ]
    with start_ollama(["seen"]) as server:
        make_llm(server.url, max_images=2).chat(history)
    sent = server.chat_requests[0]["messages"]
    assert [m.get("images") for m in sent[1:]] == [None, None, None, [png(3)], [png(4)]]
    assert all(SCREENSHOT_DROPPED in m["content"] for m in sent[1:4])


def test_a_429_server_busy_is_retried_with_backoff():
    # Ollama answers 429 when its queue (OLLAMA_MAX_QUEUE) is full: busy now, not wrong.
    with start_ollama(["after the queue cleared"]) as server:
        server.fail_next(2, status=429, error="server busy, please try again.  maximum pending requests exceeded")
        reply = make_llm(server.url, retries=2).chat(TASK)
    assert reply.content == "after the queue cleared"
    assert [r.outcome for r in server.chats] == ["failed 429", "failed 429", "reply"]


def test_a_429_that_lasts_ends_in_a_bounded_ollama_error():
    with start_ollama(["never reached"]) as server:
        server.fail_next(5, status=429, error="server busy, please try again")
        with pytest.raises(OllamaError) as caught:
            make_llm(server.url, retries=1).chat(TASK)
    assert len(server.chats) == 2 and caught.value.status == 429
    assert "busy" in str(caught.value) and "2 tries" in str(caught.value)
