"""A real HTTP server speaking the OpenAI chat completions protocol (/v1), playing a script
of model turns: the stand-in for vLLM, llama.cpp's llama-server, SGLang or LM Studio in
whole-job tests, as tests/support/ollama_server.py is for Ollama. Its turns are that module's
`Turn`s, so one script plays on either.

    with start_openai([Turn(content="hello")]) as server:
        AgentConfig(model_api="openai", model_url=server.base_url, model=server.model_name)
        server.chat_requests[-1]["messages"]

The stream is shaped as the real servers send it, and tests/vmagent/models/test_llamacpp_real.py
(`test_the_stand_ins_stream_has_the_real_servers_shape`) checks that shape against a real
llama.cpp server's stream for the same request:
- server-sent events, `data: {chunk}` and a blank line, ending with `data: [DONE]`;
- a first chunk with the role, then `reasoning_content` and `content` pieces;
- each tool call's first delta carries its `index`, `id`, `type` and `function.name` with
  the first fragment of its arguments; the rest of the arguments JSON follows in
  fragments of `arguments_chunk_chars`, by index; with two calls or more the fragments
  interleave (call 0, call 1, call 0, ...), as the protocol allows and the client must read;
- a chunk with an empty delta and the `finish_reason`, then, with
  stream_options.include_usage, a chunk with no choices and the `usage`.
Errors are answered in vLLM's and llama.cpp's words: 401 for a wrong key, 404 for a model
it does not serve, 400 exceed_context_size_error for a prompt past `context`.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any, Iterator

from tests.support.http_stand_in import StandInHTTPServer
from tests.support.ollama_server import Recorded, Script, Turn, _as_turn, honest_prompt_tokens

DEFAULT_MODEL = "qwen3-vl-32b"
# vLLM's max_model_len for the default model in the tests.
DEFAULT_CONTEXT = 32768


class OpenAIScriptServer:
    def __init__(self, script: Script | None = None, *, model_name: str = DEFAULT_MODEL,
                 context: int = DEFAULT_CONTEXT, key: str | None = None, list_models: bool = True,
                 vision: bool = True, arguments_chunk_chars: int = 6, default: Any = None):
        self.script: list[Any] = list(script or [])
        self.model_name = model_name
        self.context = context
        self.key = key  # when set, requests without `Authorization: Bearer <key>` get 401
        self.list_models = list_models  # False: /v1/models answers 404 (some servers have none)
        self.vision = vision
        self.arguments_chunk_chars = arguments_chunk_chars
        self.default = default
        self.requests: list[Recorded] = []
        self.headers: list[dict[str, str]] = []
        self.position = 0
        self._lock = threading.Lock()
        self._httpd: StandInHTTPServer | None = None
        self._port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests if r.path == "/v1/chat/completions"]

    @property
    def script_done(self) -> bool:
        return self.position >= len(self.script)

    def add(self, *turns: Any) -> None:
        with self._lock:
            self.script.extend(turns)

    def start(self) -> "OpenAIScriptServer":
        server = self

        class Handler(_Handler):
            script_server = server

        self._httpd = StandInHTTPServer(("127.0.0.1", self._port), Handler)
        self._port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="openai-script",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def _next_turn(self, body: dict[str, Any]) -> Turn:
        with self._lock:
            if self.position < len(self.script):
                entry = self.script[self.position]
                self.position += 1
            elif self.default is not None:
                entry = self.default
            else:
                return Turn(status=400, error="the test script has no more turns")
        return _as_turn(entry(body) if callable(entry) else entry)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script_server: OpenAIScriptServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str, **more: Any) -> None:
        # vLLM (0.9+) and llama.cpp both answer errors in OpenAI's shape.
        self._json(status, {"error": {"code": status, "message": message, "type": kind, **more}})

    def _authorised(self) -> bool:
        key = self.script_server.key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._error(401, "Invalid API Key", "authentication_error")
        return False

    def _record(self, path: str, body: dict[str, Any]) -> Recorded:
        entry = Recorded(path=path, body=body)
        with self.script_server._lock:
            self.script_server.requests.append(entry)
            self.script_server.headers.append(dict(self.headers))
        return entry

    def do_GET(self) -> None:
        self._record(self.path, {})
        server = self.script_server
        if not self._authorised():
            return
        if self.path == "/v1/models" and server.list_models:
            entry: dict[str, Any] = {"id": server.model_name, "object": "model", "created": int(time.time()),
                                     "owned_by": "vmagent-tests", "max_model_len": server.context}
            if server.vision:  # llama.cpp's way of saying it
                entry["architecture"] = {"input_modalities": ["text", "image"], "output_modalities": ["text"]}
            self._json(200, {"object": "list", "data": [entry]})
        else:
            self._error(404, f"File Not Found: {self.path}", "not_found_error")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = {}
        entry = self._record(self.path, body)
        if not self._authorised():
            entry.outcome = "refused 401"
            return
        if self.path != "/v1/chat/completions":
            entry.outcome = "unknown path"
            self._error(404, f"File Not Found: {self.path}", "not_found_error")
            return
        self._chat(body, entry)

    def _chat(self, body: dict[str, Any], entry: Recorded) -> None:
        server = self.script_server
        if body.get("model") != server.model_name:
            entry.outcome = "refused 404"
            self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
            return
        prompt_tokens = honest_prompt_tokens(_as_ollama_shape(body))
        entry.prompt_eval_count = prompt_tokens
        if prompt_tokens > server.context:
            entry.outcome = "refused 400 context"
            self._error(400, f"request ({prompt_tokens} tokens) exceeds the available context size "
                             f"({server.context} tokens), try increasing it", "exceed_context_size_error",
                        n_prompt_tokens=prompt_tokens, n_ctx=server.context)
            return
        turn = server._next_turn(body)
        if turn.status is not None:
            entry.outcome = f"failed {turn.status}"
            self._error(turn.status, turn.error, "server_error" if turn.status >= 500 else "invalid_request_error")
            return
        chunks = list(self._chunks(body, turn, prompt_tokens))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for n, chunk in enumerate(chunks):
            if turn.drop_after_chunks is not None and n >= turn.drop_after_chunks:
                entry.outcome = f"dropped after {n} chunks"
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(2)
                return
            if turn.chunk_delay_s:
                time.sleep(turn.chunk_delay_s)
            data = b"data: " + (chunk if isinstance(chunk, bytes) else json.dumps(chunk).encode()) + b"\n\n"
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError:
                entry.outcome = "client went away"
                return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        entry.outcome = "reply"

    def _chunks(self, body: dict[str, Any], turn: Turn, prompt_tokens: int) -> Iterator[Any]:
        server = self.script_server
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": server.model_name, "system_fingerprint": "vmagent-tests"}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        yield chunk({"role": "assistant", "content": None})
        size = max(1, turn.chunk_chars)
        for key, text in (("reasoning_content", turn.thinking), ("content", turn.content)):
            for i in range(0, len(text), size):
                yield chunk({key: text[i:i + size]})
        calls = [_call_parts(call, n, server.arguments_chunk_chars) for n, call in enumerate(turn.tool_calls)]
        for n, parts in enumerate(calls):  # each call's first delta, in index order
            yield chunk({"tool_calls": [{"index": n, "id": parts[0], "type": "function",
                                         "function": {"name": parts[1], "arguments": parts[2][0]}}]})
        rest = [parts[2][1:] for parts in calls]
        while any(rest):  # the fragments, interleaved by index
            for n, fragments in enumerate(rest):
                if fragments:
                    yield chunk({"tool_calls": [{"index": n, "function": {"arguments": fragments.pop(0)}}]})
        yield chunk({}, "tool_calls" if calls else turn.done_reason)
        if (body.get("stream_options") or {}).get("include_usage"):
            text = turn.thinking + turn.content + json.dumps(turn.tool_calls)
            completion = max(1, len(text) // 4)
            yield {**head, "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                                                   "total_tokens": prompt_tokens + completion}}
        yield b"[DONE]"


def _call_parts(call: dict[str, Any], n: int, size: int) -> tuple[str, str, list[str]]:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    fragments = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    return f"call_{uuid.uuid4().hex[:8]}_{n}", str(function.get("name", "")), fragments


def _as_ollama_shape(body: dict[str, Any]) -> dict[str, Any]:
    """The request with image parts counted as images, for the token estimate."""
    messages = []
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, list):
            text = " ".join(p.get("text", "") for p in content if p.get("type") == "text")
            images = [p for p in content if p.get("type") == "image_url"]
            message = {**message, "content": text, "images": ["x"] * len(images)}
        messages.append(message)
    return {"messages": messages, "tools": body.get("tools")}


@contextlib.contextmanager
def start_openai(script: Script | None = None, **opts: Any) -> Iterator[OpenAIScriptServer]:
    server = OpenAIScriptServer(script, **opts).start()
    try:
        yield server
    finally:
        server.stop()
