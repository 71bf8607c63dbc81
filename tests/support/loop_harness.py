"""What the loop tests share: a real vmd on a socket (with the stand-in machine of
tests/support/vmd_fakes.py), the scripted Ollama server, and short ways to write a model's turns."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from tests.support.ollama_server import OllamaScriptServer, Turn
from tests.support.vmd_fakes import LocalMachines, make_config
from vmagent.config import AgentConfig
from vmd.server.rpc import VmdServer


def call(name: str, arguments: Any = None, content: str = "", **kw: Any) -> Turn:
    """A model turn that calls one tool (arguments may be a dict or a raw string)."""
    return Turn(content=content, tool_calls=[{"name": name, "arguments": {} if arguments is None else arguments}],
                **kw)


def calls(*pairs: tuple[str, Any], content: str = "") -> Turn:
    return Turn(content=content, tool_calls=[{"name": n, "arguments": a} for n, a in pairs])


def is_summary_request(body: dict) -> bool:
    messages = body.get("messages") or []
    return bool(messages) and messages[0].get("role") == "system" and str(
        messages[0].get("content", "")).startswith("You condense")


def agent_config(server: OllamaScriptServer, **overrides: Any) -> AgentConfig:
    # vmd_reconnect_s: a test whose vmd goes away for good should not wait the default 180 s.
    values = dict(ollama_host=server.url, model="qwen3:32b", retries=0, retry_backoff_s=0.0,
                  request_timeout_s=20, vmd_reconnect_s=5)
    values.update(overrides)
    return AgentConfig(**values)


@dataclass
class Vmd:
    server: VmdServer
    machines: LocalMachines
    config: Any

    @property
    def socket(self) -> str:
        return str(self.config.socket)

    def record(self, session_id: str) -> list[dict]:
        path = self.config.sessions_dir / session_id / "record.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def project(self, name: str, owner: str = "local") -> Path:
        return self.config.projects_dir / owner / name


@contextlib.contextmanager
def running_vmd(tmp_path: Path, **machine_opts: Any) -> Iterator[Vmd]:
    machines = LocalMachines(**machine_opts)
    config = make_config(tmp_path)
    server = VmdServer(config, machines).start()
    try:
        yield Vmd(server, machines, config)
    finally:
        server.stop()


def sent_tool_names(body: dict) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or []]


def tool_results(body: dict) -> list[str]:
    return [m.get("content", "") for m in body.get("messages") or [] if m.get("role") == "tool"]


def user_texts(body: dict) -> list[str]:
    return [m.get("content", "") for m in body.get("messages") or [] if m.get("role") == "user"]
