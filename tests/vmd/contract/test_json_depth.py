"""JSON from outside is measured before it is parsed (vmd/contract/json_depth.py): a text nested
10,000 deep is refused with TooDeep, never with a RecursionError, at every door it comes
through here (the model's tool arguments, an Ollama server's stream); the RPC wire, the
service's bodies and read_page have their own tests (test_rpc_fuzz, test_service_security,
test_web_page). Python 3.11.2's defect is the reason: afterwards, code still compiles."""

from __future__ import annotations

import ast
import http.server
import threading
import time

import ollama
import pytest

from vmagent.models import ModelError as OllamaError
from vmagent.models.ollama.depth_transport import DepthBoundTransport
from vmagent.models.ollama.failures import OllamaFailures as Failures
from vmagent.tools.parsing import _decode
from vmd.contract import json_depth
from vmd.contract.json_depth import TooDeep, loads as bounded_json

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize("text, depth", [
    ("1", 0), ("[]", 1), ("{}", 1), ('{"a": [1, {"b": []}]}', 4),
    ('"[[[["', 0), ('["\\"[[", "]"]', 1), ('{"a": "\\\\", "b": [[]]}', 3), ('{"k": "é[", "v": [[1]]}', 3),
])
def test_the_depth_is_counted_outside_strings(text, depth):
    assert json_depth.depth(text) == depth
    assert json_depth.depth(text.encode()) == depth


def test_a_text_ten_thousand_deep_is_refused_and_the_interpreter_stays_whole():
    for text in (DEEP, DEEP.encode(), '{"a": ' + "{\"b\": " * 10_000 + "1" + "}" * 10_001, "[" * 50_000):
        with pytest.raises(TooDeep, match="deeper than 200 levels"):
            bounded_json(text)
    # What 3.11.2 failed at after a RecursionError in json: compiling nested code.
    compile("f(" * 100 + ")" * 100, "<nested>", "eval")
    ast.parse("[" * 90 + "]" * 90)


def test_shallow_json_and_long_strings_pass_through_unchanged():
    assert bounded_json('{"a": [1, 2, {"b": "[[[["}]}') == {"a": [1, 2, {"b": "[[[["}]}
    nested = "[" * 200 + "]" * 200
    assert json_depth.depth(nested) == 200 and bounded_json(nested)  # the limit itself is read
    with pytest.raises(TooDeep):
        bounded_json("[" + nested + "]")
    with pytest.raises(ValueError):  # not JSON: json's own error, as before
        bounded_json("{'a': 1}")


def test_deep_tool_arguments_are_the_models_string_not_a_crash():
    # json_repair parses by recursion too: a text this deep is kept as the model sent it,
    # and the tool answers it with an error line (tests/vmagent/tools/test_tools.py).
    raw = '{"command": ' + DEEP + "}"
    assert _decode(raw) == raw


class _DeepOllama(http.server.BaseHTTPRequestHandler):
    """An Ollama-shaped server whose /api/chat stream sends one good chunk, then a line nested
    10,000 deep; /api/show answers one whole body that deep."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/api/show":
            parts = [b'{"capabilities": ' + DEEP.encode() + b"}"]
        else:
            good = b'{"model": "m", "created_at": "2026-01-01T00:00:00Z", "message": {"role": "assistant", "content": "hi"}, "done": false}'
            parts = [good + b"\n", b'{"message": ' + DEEP.encode() + b"}\n"]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Content-Length", str(sum(map(len, parts))))
        self.end_headers()
        for part in parts:  # as a stream comes: the good line first, on its own
            self.wfile.write(part)
            self.wfile.flush()
            time.sleep(0.3)


@pytest.fixture
def deep_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DeepOllama)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_ollama_reply_too_deep_ends_with_a_sentence_before_the_client_parses_it(deep_server):
    client = ollama.Client(host=deep_server, transport=DepthBoundTransport())
    stream = client.chat(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert next(stream).message.content == "hi"  # what came before the deep line is read
    with pytest.raises(TooDeep):
        next(stream)
    with pytest.raises(TooDeep):
        client.show("m")
    said = Failures(deep_server, "m", 60).classify(TooDeep(200), streamed=True)
    assert isinstance(said, OllamaError)
    assert f"Ollama at {deep_server}" in str(said) and "deeper than 200 levels" in str(said)
