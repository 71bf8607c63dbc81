"""A real HTTP server speaking Ollama's protocol, playing a script of model turns.

Used only through the official `ollama` client, so the tests exercise what goes over
the wire: NDJSON streaming of /api/chat, /api/show capabilities, /api/tags, /api/version.

    with start_ollama([Turn(content="hello")]) as server:
        client = ollama.Client(host=server.url)
        ...
        server.chat_requests[-1]["options"]["num_ctx"]

`go_away(seconds)` stops listening (connections are refused, as when Ollama stops) and
comes back on the same port after that long; `stop()` then `start()` does it by hand.

A script is a list of turns; each is a `Turn`, a str (plain text reply), a dict of Turn
fields, or a callable `(request_json) -> Turn | str | dict` that answers based on what
was sent. Each /api/chat request consumes one turn.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Iterator, Union

from tests.support.http_stand_in import StandInHTTPServer

# What Ollama 0.12 reports for the default model, qwen3-vl:32b.
DEFAULT_CAPABILITIES = ["completion", "vision", "tools", "thinking"]
# What Ollama uses when a request sets no num_ctx (4096 since 0.6; 2048 before).
OLLAMA_DEFAULT_NUM_CTX = 4096


@dataclass
class Turn:
    content: str = ""
    thinking: str = ""
    # [{"name": ..., "arguments": {...}}] or Ollama's own [{"function": {...}}]
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    done_reason: str = "stop"
    # Characters per streamed chunk of thinking and content.
    chunk_chars: int = 7
    # Drop the connection after this many chunks were sent (0: before the first).
    drop_after_chunks: int | None = None
    # Answer with this HTTP status and error text instead of a reply.
    status: int | None = None
    error: str = "scripted failure"
    # Seconds to wait between chunks (to test timeouts and live streaming).
    chunk_delay_s: float = 0.0


Script = list[Union[Turn, str, dict, Callable[[dict], Any]]]


@dataclass
class Recorded:
    path: str
    body: dict[str, Any]
    # What happened: "reply", "failed 500", "dropped", "refused 400 ..."
    outcome: str = ""
    prompt_eval_count: int | None = None


def honest_prompt_tokens(body: dict[str, Any], image_tokens: int = 1300) -> int:
    """A fair stand-in for Ollama's token count: JSON characters / 4, images at a fixed cost."""
    messages = []
    images = 0
    for m in body.get("messages") or []:
        m = dict(m)
        images += len(m.pop("images", None) or [])
        messages.append(m)
    chars = len(json.dumps(messages, ensure_ascii=False))
    if body.get("tools"):
        chars += len(json.dumps(body["tools"], ensure_ascii=False))
    return chars // 4 + images * image_tokens


class OllamaScriptServer:
    def __init__(
        self,
        script: Script | None = None,
        *,
        capabilities: list[str] | None = None,
        models: list[str] | None = None,
        default: Turn | str | Callable[[dict], Any] | None = None,
        image_tokens: int = 1300,
        version: str = "0.12.6",
    ):
        self.script: list[Any] = list(script or [])
        self.capabilities = list(DEFAULT_CAPABILITIES if capabilities is None else capabilities)
        # None: every model name is known. Otherwise others get Ollama's 404.
        self.models = models
        # Played when the script is used up; None answers 400 "script exhausted".
        self.default = default
        self.image_tokens = image_tokens
        self.version = version
        self.requests: list[Recorded] = []
        self.position = 0
        self._failures: list[tuple[int, str]] = []
        self._drops: list[int] = []
        self._lock = threading.Lock()
        self._httpd: StandInHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._url = ""
        self._port = 0  # kept across stop() so that start() comes back on the same port
        self._comeback: threading.Timer | None = None
        self._lifecycle = threading.RLock()

    # --- controls for tests -----------------------------------------------------------

    def fail_next(self, n: int = 1, status: int = 500, error: str = "scripted server error") -> None:
        """The next n /api/chat requests get this HTTP status without using a turn."""
        with self._lock:
            self._failures.extend([(status, error)] * n)

    def drop_next(self, after_chunks: int = 0) -> None:
        """The next /api/chat request plays its turn but the connection drops after `after_chunks` chunks."""
        with self._lock:
            self._drops.append(after_chunks)

    def go_away(self, seconds: float | None = None) -> None:
        """Stop listening now: new connections are refused, as when Ollama stops (a reply
        being streamed goes on unless its turn drops it). With `seconds`, start again on
        the same port after that long. Safe to call from a callable script turn."""
        self.stop()
        if seconds is not None:
            with self._lifecycle:
                timer = threading.Timer(seconds, lambda: self._come_back(timer))
                timer.daemon = True
                self._comeback = timer
                timer.start()

    def _come_back(self, timer: threading.Timer) -> None:
        with self._lifecycle:
            if self._comeback is not timer:  # stopped for good meanwhile
                return
            self._comeback = None
            self.start()

    def add(self, *turns: Any) -> None:
        with self._lock:
            self.script.extend(turns)

    @property
    def url(self) -> str:
        assert self._url, "the server was never started"
        return self._url

    @property
    def script_done(self) -> bool:
        return self.position >= len(self.script)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests if r.path == "/api/chat"]

    @property
    def chats(self) -> list[Recorded]:
        return [r for r in self.requests if r.path == "/api/chat"]

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> "OllamaScriptServer":
        server = self

        class Handler(_Handler):
            script_server = server

        with self._lifecycle:
            if self._httpd is not None:
                return self
            self._httpd = StandInHTTPServer(("127.0.0.1", self._port), Handler)
            host, port = self._httpd.server_address[:2]
            self._port = port
            self._url = f"http://{host}:{port}"
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="ollama-script", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._lifecycle:
            if self._comeback is not None:
                self._comeback.cancel()
                self._comeback = None
            if self._httpd is not None:
                self._httpd.shutdown()
                self._httpd.server_close()
                self._httpd = None

    @property
    def listening(self) -> bool:
        return self._httpd is not None

    # --- playing the script -----------------------------------------------------------

    def _next_turn(self, body: dict[str, Any]) -> Turn:
        with self._lock:
            if self._failures:
                status, error = self._failures.pop(0)
                return Turn(status=status, error=error)
            drop = self._drops.pop(0) if self._drops else None
            if self.position < len(self.script):
                entry = self.script[self.position]
                self.position += 1
            elif self.default is not None:
                entry = self.default
            else:
                return Turn(status=400, error="the test script has no more turns")
        turn = _as_turn(entry(body) if callable(entry) else entry)
        if drop is not None:
            turn = Turn(**{**turn.__dict__, "drop_after_chunks": drop})
        return turn


def _as_turn(value: Any) -> Turn:
    if isinstance(value, Turn):
        return value
    if isinstance(value, str):
        return Turn(content=value)
    if isinstance(value, dict):
        return Turn(**value)
    raise TypeError(f"a script turn must be a Turn, str or dict, not {type(value).__name__}")


def _tool_call_wire(call: dict[str, Any]) -> dict[str, Any]:
    if "function" in call:
        return call
    return {"function": {"name": call["name"], "arguments": call.get("arguments", {})}}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script_server: OllamaScriptServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet in test output
        pass

    # --- plumbing ---------------------------------------------------------------------

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            data = {"_unparsed": raw.decode("utf-8", "replace")}
        return data if isinstance(data, dict) else {"_body": data}

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, path: str, body: dict[str, Any]) -> Recorded:
        entry = Recorded(path=path, body=body)
        with self.script_server._lock:
            self.script_server.requests.append(entry)
        return entry

    def _model_known(self, model: str) -> bool:
        models = self.script_server.models
        return models is None or model in models or model.split(":")[0] in models

    # --- routes -----------------------------------------------------------------------

    def do_GET(self) -> None:
        self._record(self.path, {})
        if self.path == "/api/version":
            self._json(200, {"version": self.script_server.version})
        elif self.path == "/api/tags":
            names = self.script_server.models or ["qwen3:32b"]
            self._json(
                200,
                {
                    "models": [
                        {
                            "name": n,
                            "model": n,
                            "modified_at": _now(),
                            "size": 20_000_000_000,
                            "digest": "0" * 64,
                            "details": {"format": "gguf", "family": "qwen3", "parameter_size": "32B",
                                        "quantization_level": "Q4_K_M"},
                        }
                        for n in names
                    ]
                },
            )
        elif self.path in ("/", ""):
            data = b"Ollama is running"
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._json(404, {"error": "not found"})

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = self._body()
        entry = self._record(self.path, body)
        if self.path == "/api/show":
            self._show(body, entry)
        elif self.path == "/api/chat":
            self._chat(body, entry)
        else:
            entry.outcome = "unknown path"
            self._json(404, {"error": f"unknown path {self.path}"})

    def _show(self, body: dict[str, Any], entry: Recorded) -> None:
        model = str(body.get("model") or body.get("name") or "")
        if not self._model_known(model):
            entry.outcome = "refused 404"
            self._json(404, {"error": f"model '{model}' not found"})
            return
        entry.outcome = "shown"
        self._json(
            200,
            {
                "modelfile": f"FROM {model}",
                "parameters": "",
                "template": "{{ .Prompt }}",
                "details": {"format": "gguf", "family": "qwen3", "parameter_size": "32B",
                            "quantization_level": "Q4_K_M"},
                "model_info": {"general.architecture": "qwen3", "qwen3.context_length": 40960},
                "capabilities": self.script_server.capabilities,
                "modified_at": _now(),
            },
        )

    def _chat(self, body: dict[str, Any], entry: Recorded) -> None:
        server = self.script_server
        model = str(body.get("model") or "")
        if not self._model_known(model):
            entry.outcome = "refused 404"
            self._json(404, {"error": f'model "{model}" not found, try pulling it first'})
            return
        # Ollama refuses what the model cannot do, with these words.
        if body.get("think") and "thinking" not in server.capabilities:
            entry.outcome = "refused 400 think"
            self._json(400, {"error": f'"{model}" does not support thinking'})
            return
        if body.get("tools") and "tools" not in server.capabilities:
            entry.outcome = "refused 400 tools"
            self._json(400, {"error": f"{model} does not support tools"})
            return

        turn = server._next_turn(body)
        if turn.status is not None:
            entry.outcome = f"failed {turn.status}"
            self._json(turn.status, {"error": turn.error})
            return

        num_ctx = (body.get("options") or {}).get("num_ctx") or OLLAMA_DEFAULT_NUM_CTX
        # Ollama truncates a prompt longer than the context and reports what it kept.
        prompt_tokens = min(honest_prompt_tokens(body, server.image_tokens), num_ctx)
        entry.prompt_eval_count = prompt_tokens
        reply_text = turn.thinking + turn.content + json.dumps(turn.tool_calls)
        final = {
            "model": model,
            "created_at": _now(),
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": turn.done_reason,
            "total_duration": 1_000_000,
            "load_duration": 1000,
            "prompt_eval_count": prompt_tokens,
            "prompt_eval_duration": 1000,
            "eval_count": max(1, len(reply_text) // 4),
            "eval_duration": 1000,
        }
        tool_calls = [_tool_call_wire(c) for c in turn.tool_calls]

        if body.get("stream") is False:
            if turn.drop_after_chunks is not None:
                entry.outcome = "dropped"
                self._drop()
                return
            message: dict[str, Any] = {"role": "assistant", "content": turn.content}
            if turn.thinking:
                message["thinking"] = turn.thinking
            if tool_calls:
                message["tool_calls"] = tool_calls
            entry.outcome = "reply"
            self._json(200, {**final, "message": message})
            return

        chunks = list(self._chunks(model, turn, tool_calls)) + [final]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for n, chunk in enumerate(chunks):
            if turn.drop_after_chunks is not None and n >= turn.drop_after_chunks:
                entry.outcome = f"dropped after {n} chunks"
                self._drop()
                return
            if turn.chunk_delay_s:
                time.sleep(turn.chunk_delay_s)
            data = (json.dumps(chunk) + "\n").encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError:
                entry.outcome = "client went away"
                return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        entry.outcome = "reply"

    def _chunks(self, model: str, turn: Turn, tool_calls: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        size = max(1, turn.chunk_chars)
        for key, text in (("thinking", turn.thinking), ("content", turn.content)):
            for i in range(0, len(text), size):
                message = {"role": "assistant", "content": ""}
                message[key] = text[i : i + size]
                yield {"model": model, "created_at": _now(), "message": message, "done": False}
        if tool_calls:
            yield {
                "model": model,
                "created_at": _now(),
                "message": {"role": "assistant", "content": "", "tool_calls": tool_calls},
                "done": False,
            }

    def _drop(self) -> None:
        """Cut the connection without finishing the response, as a crashed server would."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def start_ollama(script: Script | None = None, **opts: Any) -> Iterator[OllamaScriptServer]:
    """Run an OllamaScriptServer on a free loopback port for the duration of the block."""
    server = OllamaScriptServer(script, **opts).start()
    try:
        yield server
    finally:
        server.stop()


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released), for 'unreachable' tests."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
