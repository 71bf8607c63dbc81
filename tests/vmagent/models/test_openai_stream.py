"""Reading an OpenAI-compatible event stream (vmagent/models/openai/stream.py) in the shapes servers
send besides the common one: no index on a call's deltas, arguments as an object, a
keep-alive comment, an event split over two data lines, [DONE] without a finish_reason,
an error object inside the stream."""

from __future__ import annotations

import json

import pytest

from vmagent.models.openai.failures import StreamError
from vmagent.models.openai.stream import OpenAIEvents
from vmagent.models.stream import ReplyStream


def read(*lines: str) -> ReplyStream:
    stream = ReplyStream(None, None)
    events = OpenAIEvents(stream)
    for line in lines:
        events.take_line(line)
    events.close()
    return stream


def data(chunk: dict) -> str:
    return "data: " + json.dumps(chunk)


def delta(**fields) -> dict:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def test_calls_without_an_index_are_told_apart_by_their_ids():
    stream = read(
        data(delta(tool_calls=[{"id": "a", "function": {"name": "run", "arguments": '{"comm'}}])), "",
        data(delta(tool_calls=[{"function": {"arguments": 'and": "ls"}'}}])), "",
        data(delta(tool_calls=[{"id": "b", "function": {"name": "read_file", "arguments": {"path": "x"}}}])), "",
        data({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}), "",
        "data: [DONE]", "")
    reply = stream.reply()
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("a", "run", {"command": "ls"}), ("b", "read_file", {"path": "x"})]
    assert reply.done_reason == "tool_calls"


def test_comments_split_events_and_done_without_a_finish_reason():
    stream = read(": ping", "", 'data: {"choices": [{"index": 0,', 'data:  "delta": {"content": "hi"}}]}', "",
                  "event: message", "data: [DONE]", "")
    assert stream.finished and stream.reply().content == "hi" and stream.reply().done_reason == "stop"


def test_a_stream_that_stops_without_a_finish_is_not_finished():
    stream = read(data(delta(content="half")), "")
    assert not stream.finished


def test_arguments_that_are_not_json_stay_the_models_string():
    stream = read(data(delta(tool_calls=[{"index": 0, "id": "a", "function": {"name": "run", "arguments": "ls -la"}}])),
                  "", "data: [DONE]", "")
    assert stream.reply().tool_calls[0].arguments == "ls -la"


def test_an_error_inside_the_stream_is_raised_with_the_servers_words():
    with pytest.raises(StreamError, match="out of memory"):
        read(data(delta(content="a")), "", data({"error": {"message": "CUDA out of memory", "code": 500}}), "")
