"""A real Open WebUI for the tests: installed from PyPI into an environment of its own,
started on loopback with its data in a temporary folder, driven through its REST API and
its socket.io channel the way its browser front end drives it.

    python -m tests.support.openwebui_harness install     # scripts/setup.sh runs this

The environment is a cache outside the clone, `$VMAGENT_CACHE_DIR/openwebui-<hash>/`
(default /var/cache/vmagent), named by a hash of its recipe: the pinned release and the
Python it runs on. A second install of the same recipe does nothing; a half-finished one
(no `.complete` file) is removed and made again.

The parts, each small:
- `OpenWebUIServer`: `open-webui serve` as a process; the first account is the admin.
- `Browser`: a socket.io client logged in as one person. It records the events a chat
  would show (status, embeds, completion) and answers `__event_call__` dialogs as the
  person's click would (`click`).
- `Chat`: one conversation, sent through `POST /api/chat/completions` as the front end
  sends it (chat id, user message, the browser's session id, tool ids, function-calling
  mode), waited on through the browser's events, stopped as the Stop button stops it.
- `ToolCallingModel`: what the Ollama-protocol stand-in (tests/support/ollama_server.py) answers:
  the tool call it is told to make, in Native mode as a `tool_calls` reply and in legacy
  mode as the JSON Open WebUI's tool-choosing prompt asks for; then the tool's text back.
"""

from __future__ import annotations

import hashlib
import html
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Callable

import httpx

from tests.support.ollama_server import Turn
from tests.support.service_harness import free_port

OPEN_WEBUI = "open-webui==0.12.4"
# Open WebUI 0.12 declares Python >=3.11,<3.13.
PYTHON_RANGE = ((3, 11), (3, 12))
CACHE_ROOT = Path(os.environ.get("VMAGENT_CACHE_DIR", "/var/cache/vmagent"))
TOOL_FILE = Path(__file__).resolve().parents[2] / "vmagent" / "openwebui" / "vm_agent.py"
TOOL_ID = "vm_agent"
# A cold start on the 2-core CI host took 23 s (imports, migrations, the scheduler).
START_TIMEOUT_S = 240


# --- the environment ---------------------------------------------------------------------

def recipe() -> str:
    return f"python {sys.version_info.major}.{sys.version_info.minor}\n{OPEN_WEBUI}\n"


def env_dir() -> Path:
    return CACHE_ROOT / f"openwebui-{hashlib.sha256(recipe().encode()).hexdigest()[:12]}"


def installed() -> Path | None:
    """The environment's folder when it is complete, else None."""
    env = env_dir()
    return env if (env / ".complete").exists() and (env / "bin" / "open-webui").exists() else None


def missing_reason() -> str:
    return (f"Open WebUI ({OPEN_WEBUI}) is not installed in {env_dir()}; "
            "run `.venv/bin/python -m tests.support.openwebui_harness install` (scripts/setup.sh does)")


def install() -> Path:
    """Makes the environment unless it is there; returns its folder."""
    if (env := installed()) is not None:
        print(f"Open WebUI environment: {env} (cached)")
        return env
    version = sys.version_info[:2]
    if not PYTHON_RANGE[0] <= version <= PYTHON_RANGE[1]:
        raise SystemExit(f"{OPEN_WEBUI} needs Python 3.11 or 3.12; this is {version[0]}.{version[1]}")
    env = env_dir()
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # The base interpreter, not this virtual environment's: the new one stands alone.
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(env)], check=True)
    subprocess.run([str(env / "bin" / "pip"), "install", "--no-input", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(env / "bin" / "pip"), "install", "--no-input", "-q", OPEN_WEBUI], check=True)
    took = time.monotonic() - started
    (env / ".complete").write_text(json.dumps({"recipe": recipe(), "install_s": round(took)}) + "\n")
    print(f"Open WebUI environment: {env} (installed in {took:.0f} s)")
    return env


# --- the server --------------------------------------------------------------------------

class OpenWebUIServer:
    """`open-webui serve` on a free loopback port, its data under `data_dir`, its models
    from the Ollama server at `ollama_url`."""

    def __init__(self, env: Path, data_dir: Path, ollama_url: str):
        self.env = env
        self.data_dir = Path(data_dir)
        self.ollama_url = ollama_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.data_dir / "open-webui.log"
        self.proc: subprocess.Popen | None = None

    def environment(self) -> dict[str, str]:
        keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE")
        return {**{k: os.environ[k] for k in keep if k in os.environ},
                "DATA_DIR": str(self.data_dir), "WEBUI_SECRET_KEY": "vmagent-tests",
                "OLLAMA_BASE_URL": self.ollama_url, "ENABLE_OPENAI_API": "false",
                # Nothing from outside this machine: no model downloads, no version checks,
                # no pip installs of tool requirements (httpx is in Open WebUI already).
                "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1", "RAG_EMBEDDING_ENGINE": "ollama",
                "ENABLE_VERSION_UPDATE_CHECK": "false", "ANONYMIZED_TELEMETRY": "false",
                "DO_NOT_TRACK": "true", "SCARF_NO_ANALYTICS": "true",
                # The chat's side calls (titles, tags, follow-ups) would take turns from the
                # scripted model; the tests are about the tool.
                "ENABLE_TITLE_GENERATION": "false", "ENABLE_TAGS_GENERATION": "false",
                "ENABLE_FOLLOW_UP_GENERATION": "false", "ENABLE_AUTOCOMPLETE_GENERATION": "false",
                # People who are not admins may use the Ollama models without a model entry.
                "BYPASS_MODEL_ACCESS_CONTROL": "true", "DEFAULT_USER_ROLE": "user"}

    def start(self) -> "OpenWebUIServer":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.env / "bin" / "open-webui"), "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                cwd=self.data_dir, env=self.environment(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"open-webui serve exited {self.proc.returncode}: {self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"open-webui serve did not answer within {START_TIMEOUT_S} s: {self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def client(self, token: str = "") -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    # --- accounts ------------------------------------------------------------------------

    def sign_up_admin(self, name: str = "Admin", email: str = "admin@example.org") -> "Account":
        """The first account signed up is the admin."""
        with self.client() as api:
            reply = checked(api.post("/api/v1/auths/signup", json={
                "name": name, "email": email, "password": PASSWORD}))
        return Account(reply["id"], name, email, reply["token"], reply["role"])

    def add_user(self, admin: "Account", name: str, email: str) -> "Account":
        """A person added by the admin (Admin Panel → Users → Add), then signed in."""
        with self.client(admin.token) as api:
            checked(api.post("/api/v1/auths/add", json={
                "name": name, "email": email, "password": PASSWORD, "role": "user"}))
        with self.client() as api:
            reply = checked(api.post("/api/v1/auths/signin", json={"email": email, "password": PASSWORD}))
        return Account(reply["id"], reply["name"], email, reply["token"], reply["role"])

    # --- the tool ------------------------------------------------------------------------

    def register_tool(self, admin: "Account") -> dict:
        """Workspace → Tools → + with the tool file's source, readable by every user."""
        with self.client(admin.token) as api:
            return checked(api.post("/api/v1/tools/create", json={
                "id": TOOL_ID, "name": "VM Agent", "content": TOOL_FILE.read_text(),
                "meta": {"description": "Hands a coding task to an agent in a virtual machine."},
                "access_grants": [{"principal_type": "user", "principal_id": "*", "permission": "read"}],
            }))

    def set_valves(self, admin: "Account", **valves: Any) -> dict:
        with self.client(admin.token) as api:
            return checked(api.post(f"/api/v1/tools/id/{TOOL_ID}/valves/update", json=valves))

    def tool_specs(self, account: "Account") -> list[dict]:
        """The tool's functions as Open WebUI describes them to a model (built from the
        file's signatures and docstrings when it was registered)."""
        with self.client(account.token) as api:
            return checked(api.get(f"/api/v1/tools/id/{TOOL_ID}"))["specs"]


PASSWORD = "vmagent-Tests-2026!"


class Account:
    def __init__(self, id: str, name: str, email: str, token: str, role: str):
        self.id, self.name, self.email, self.token, self.role = id, name, email, token, role


def checked(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise AssertionError(f"{response.request.method} {response.request.url.path} answered "
                             f"{response.status_code}: {response.text[:2000]}")
    return response.json()


# --- the browser -------------------------------------------------------------------------

class Browser:
    """The person's browser tab: a socket.io connection as Open WebUI's front end opens it
    (path /ws/socket.io, the session token, `user-join`). `click` answers confirmation
    dialogs: True (Confirm), False (Cancel), or None to leave them unanswered."""

    def __init__(self, server: OpenWebUIServer, account: Account):
        import socketio  # python-socketio, from the test extras

        self.account = account
        self.events: list[dict] = []
        self.dialogs: list[dict] = []
        self.click: bool | None = None
        self._changed = threading.Condition()
        self.sio = socketio.Client(reconnection=False)
        self.sio.on("events", self._on_event)
        in_arrival_order(self.sio)
        self.sio.connect(server.url, socketio_path="/ws/socket.io", transports=["websocket"],
                         auth={"token": account.token}, wait_timeout=30)
        self.sio.call("user-join", {"auth": {"token": account.token}}, timeout=30)

    @property
    def session_id(self) -> str:
        return self.sio.get_sid()

    def _on_event(self, payload: dict):
        with self._changed:
            self.events.append(payload)
            self._changed.notify_all()
        event = payload.get("data") or {}
        if event.get("type") == "confirmation":
            self.dialogs.append(event.get("data") or {})
            return self.click
        return None

    def of_message(self, message_id: str, kind: str | None = None) -> list[dict]:
        """The `data` of each event for one assistant message, optionally of one type."""
        return [e["data"] for e in list(self.events) if e.get("message_id") == message_id
                and (kind is None or (e.get("data") or {}).get("type") == kind)]

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = predicate()
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} within {timeout:.0f} s; events: "
                                         f"{json.dumps(self.events[-12:])[:4000]}")
                self._changed.wait(min(left, 0.5))

    def close(self) -> None:
        self.sio.disconnect()


def in_arrival_order(sio) -> None:
    """Makes a socket.io client handle its messages one at a time, in the order they came,
    as a browser tab does.

    python-engineio's client hands each message it reads to a thread of its own
    (`_trigger_event(..., run_async=True)`), so events Open WebUI sent in order could be
    recorded in another order, or after a later one. A CI run under load failed so: the tool
    emits "VM agent (done): done", then "The VM agent finished." twice (the second done),
    awaiting each, and the test read the job's status last. Each message's thread now takes
    a ticket in the reading thread, which reads in the wire's order, and waits its turn."""
    eio = sio.eio
    spawn = eio.start_background_task
    turn = threading.Condition()
    tickets = itertools.count()
    serving = [0]  # the ticket whose turn it is

    def start(target, *args, **kwargs):
        if target is not eio.handlers.get("message"):
            return spawn(target, *args, **kwargs)  # the read and write loops
        ticket = next(tickets)  # here, in the reading thread

        def in_turn():
            with turn:
                turn.wait_for(lambda: serving[0] == ticket)
            try:
                target(*args, **kwargs)
            finally:
                with turn:
                    serving[0] += 1
                    turn.notify_all()

        return spawn(in_turn)

    eio.start_background_task = start


# --- a conversation ----------------------------------------------------------------------

class Chat:
    """One chat as the front end runs it: the first message creates it (`parent_id: null`),
    each later one continues it; every reply is streamed to the browser's socket."""

    def __init__(self, server: OpenWebUIServer, browser: Browser, model: str, mode: str):
        self.server = server
        self.browser = browser
        self.model = model
        self.mode = mode  # Open WebUI's function calling: "native" (its default) or "legacy"
        self.id: str | None = None
        self.last_reply_id: str | None = None
        self.messages: list[dict] = []

    def send(self, text: str) -> str:
        """Sends `text` and returns the assistant message's id; the reply goes on in the
        background, as it does behind a browser."""
        user_id, reply_id = str(uuid.uuid4()), str(uuid.uuid4())
        self.messages.append({"role": "user", "content": text})
        body = {
            "model": self.model, "stream": True, "messages": self.messages,
            "tool_ids": [TOOL_ID], "params": {"function_calling": self.mode},
            "features": {}, "session_id": self.browser.session_id, "id": reply_id,
            "user_message": {"id": user_id, "parentId": self.last_reply_id, "childrenIds": [],
                             "role": "user", "content": text, "models": [self.model],
                             "timestamp": int(time.time())},
            "parent_id": self.last_reply_id,
        }
        if self.id:
            body["chat_id"] = self.id
        with self.server.client(self.browser.account.token) as api:
            started = checked(api.post("/api/chat/completions", json=body))
        assert started.get("status") is True and started.get("chat_id"), started
        self.id = started["chat_id"]
        self.last_reply_id = reply_id
        return reply_id

    def reply(self, reply_id: str, timeout: float = 120) -> str:
        """The finished reply's text, once the browser got its last completion event."""
        def finished():
            for event in self.browser.of_message(reply_id):
                data = event.get("data") or {}
                if event.get("type") == "chat:message:error":
                    raise AssertionError(f"Open WebUI reported an error: {data}")
                if event.get("type") == "chat:completion" and data.get("done"):
                    return data
            return None

        done = self.browser.wait_for(finished, timeout, f"finished reply {reply_id}")
        content = done.get("content") or self.stored_content(reply_id)
        self.messages.append({"role": "assistant", "content": content})
        return content

    def say(self, text: str, timeout: float = 120) -> tuple[str, str]:
        reply_id = self.send(text)
        return reply_id, self.reply(reply_id, timeout)

    def stop(self) -> None:
        """The Stop button: Open WebUI cancels the chat's running task."""
        with self.server.client(self.browser.account.token) as api:
            checked(api.post(f"/api/tasks/chat/{self.id}/stop"))

    def stored(self) -> dict:
        with self.server.client(self.browser.account.token) as api:
            return checked(api.get(f"/api/v1/chats/{self.id}"))

    def stored_content(self, reply_id: str) -> str:
        return self.stored()["chat"]["history"]["messages"][reply_id].get("content", "")

    def statuses(self, reply_id: str) -> list[dict]:
        return [e["data"] for e in self.browser.of_message(reply_id, "status")]

    def embeds(self, reply_id: str) -> list[dict]:
        return [e["data"] for e in self.browser.of_message(reply_id, "embeds")]


# --- the model -----------------------------------------------------------------------------

# The system prompt of Open WebUI's legacy tool choice (DEFAULT_TOOLS_FUNCTION_CALLING_PROMPT_TEMPLATE).
LEGACY_TOOL_PROMPT = "Available Tools:"
# How legacy mode hands a tool's text to the reply: a source in its RAG template.
LEGACY_SOURCE = re.compile(rf'<source id="[^"]*" name="{TOOL_ID}/[a-z_]+">(.*?)</source>', re.S)


class ToolCallingModel:
    """The stand-in model's answers, given to OllamaScriptServer as its `default`.

    `plan(name, **arguments)` queues the tool call for the next person's message. In Native
    mode the model gets the tools in the request and answers with `tool_calls`; the next
    request carries the tool's text as a `tool` message, and the model replies with it. In
    legacy mode Open WebUI first asks (stream false) which tool to call, in its own prompt,
    and wants a JSON object back; it runs the tool itself and puts the text in the prompt
    of the chat reply, which the model repeats."""

    def __init__(self):
        self.calls: deque[tuple[str, dict]] = deque()
        self.requests: list[dict] = []
        self._lock = threading.Lock()

    def plan(self, name: str, **arguments: Any) -> None:
        with self._lock:
            self.calls.append((name, arguments))

    def _next_call(self) -> tuple[str, dict] | None:
        with self._lock:
            return self.calls.popleft() if self.calls else None

    def __call__(self, body: dict) -> Turn:
        self.requests.append(body)
        messages = body.get("messages") or []
        system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
        if system.startswith(LEGACY_TOOL_PROMPT):
            call = self._next_call()
            chosen = [{"name": call[0], "parameters": call[1]}] if call else []
            return Turn(content=json.dumps({"tool_calls": chosen}))
        if messages and messages[-1].get("role") == "tool":
            return Turn(content=f"The VM tool says:\n\n{messages[-1].get('content', '')}")
        if body.get("tools"):
            call = self._next_call()
            if call:
                return Turn(tool_calls=[{"name": call[0], "arguments": call[1]}])
            return Turn(content="No tool is needed for that.")
        # Legacy mode's reply: Open WebUI put the tool's text in the prompt as a source.
        sources = [text for m in messages for text in LEGACY_SOURCE.findall(m.get("content") or "")]
        return Turn(content="The VM tool says:\n\n" + "\n\n".join(html.unescape(s) for s in sources))

    def tool_texts(self) -> list[str]:
        """Every tool result Open WebUI handed the model: Native mode's `tool` messages,
        legacy mode's sources."""
        texts = []
        for body in self.requests:
            for m in body.get("messages") or []:
                if m.get("role") == "tool":
                    texts.append(m.get("content") or "")
                elif m.get("role") in ("system", "user"):
                    texts.extend(html.unescape(s) for s in LEGACY_SOURCE.findall(m.get("content") or ""))
        return texts


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        raise SystemExit("usage: python -m tests.support.openwebui_harness install")
    install()
