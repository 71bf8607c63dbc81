"""The job service's settings: one pydantic model, loaded from a YAML/JSON file and the environment.

Secrets (tokens) come from the environment in deployments, never from a file in the repo.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from vmagent.fleet.cluster_auth import TOKEN_ENV, TOKEN_PATH_ENV, TokenProblem, auth_environment

# With the "ray" executor the hosts' guest slots (Ray's `vm_slot`) are the limit, and a job
# beyond them waits in Ray, saying so in its events. max_concurrent then bounds only the
# shims on this machine (one small process each, a Ray driver), so its default is large.
RAY_MAX_CONCURRENT = 64
# A cancelled job's report comes back through Ray from its host; a shim killed before that
# takes its worker down with it (Ray ends an actor whose driver died) and leaves the guest's
# session for the service to close without the host's vmd. So the shim gets longer.
RAY_CANCEL_GRACE_S = 15.0


class ServiceConfig(BaseModel):
    data_dir: Path = Field(Path(".state/service"), description=(
        "the job service's data: its job database and job folders (0700)"),
        json_schema_extra={"shown_default": "`.state/service` (`setup.sh`: `/var/lib/vmagent/service`)"})
    host: str = Field("127.0.0.1", description="the address the job API listens on")
    port: int = Field(8700, description="the port the job API listens on")
    # The address browsers and Open WebUI use to reach this service; the preview URL is
    # built from it. Empty: taken from the request that created the job.
    public_url: str = Field("", description=(
        "the address browsers and Open WebUI reach the service at, which preview links are built from; "
        "empty: the address of the request that made the job"))
    # token -> user id. A user sees, answers and cancels only jobs they own.
    tokens: dict[str, str] = Field(default_factory=dict, description=(
        "the job service's tokens, `tok:user,…` (added to the file's `tokens`); a user sees, answers and "
        "cancels only their own jobs"))
    # Open WebUI's token: with it (and only with it) the X-OpenWebUI-User-* headers name the user.
    service_token: str = Field("", description=(
        "Open WebUI's token: with it, and only with it, the `X-OpenWebUI-User-*` headers name the user"))
    # The users (as their tokens name them) who may see the fleet: GET /hosts (every host,
    # its load and errors) and GET /evals* (the runs' reports). VMAGENT_OPERATORS="a,b".
    # Empty: nobody; the routes answer 403 with a sentence naming this setting.
    operators: list[str] = Field(default_factory=list, description=(
        "the users (as the tokens name them) who may read `GET /hosts` and `GET /evals*`, `a,b`; others "
        "get 403"), json_schema_extra={"shown_default": "— (nobody)"})
    # How long one listing of the hosts is served again: each listing asks every host.
    hosts_cache_s: float = Field(default=5.0, ge=0, description=(
        "how long one listing of the hosts (`GET /hosts`, which asks every host) is served again"))
    # Each job holds a guest; more than this at once starves the host, so the rest queue.
    max_concurrent: int = Field(default=2, ge=1, description=(
        "jobs running at once (each holds a guest); the rest queue. With the `ray` executor the hosts' "
        "guest slots are the limit, and this bounds the shims on this machine"),
        json_schema_extra={"shown_default": "`2` (`64` with `ray`)"})
    # The job process. Default: the real worker with the interpreter running the service.
    # With the "ray" executor it is the worker the host runs (default: the host's own Python).
    worker_command: list[str] | None = Field(None, description=(
        "the job's process, as a list; unset: the worker on the service's Python (with `ray`: on the "
        "host's own Python)"))
    # "local": each job's worker runs here, against vmd_socket. "ray": each job runs on a vmd
    # host of the Ray cluster at ray_address (docs/scale-out.md), through a local shim
    # (vmagent/service/ray_worker.py). Needs `pip install 'vmagent[ray]'`.
    executor: Literal["local", "ray"] = Field("local", description=(
        "`local`: each job's worker runs here, against `VMD_SOCKET`; `ray`: on a vmd host of the Ray "
        "cluster (`docs/scale-out.md`; `pip install 'vmagent[ray]'`)"))
    # The Ray cluster's head (host:port); empty: RAY_ADDRESS, or the cluster `ray start` made here.
    ray_address: str = Field("", description=(
        "the Ray cluster's head, `host:port`; empty: the cluster `ray start` made on this machine"))
    # Ray's own setting: empty means RAY_AUTH_TOKEN, else Ray's default ~/.ray/auth_token.
    ray_token_file: str = Field("", description=(
        "the Ray cluster's token file (Ray's own `RAY_AUTH_TOKEN_PATH`); empty: `RAY_AUTH_TOKEN`, else "
        "Ray's default `~/.ray/auth_token`; a file readable by others is refused. The service and its shims run Ray with token auth, and a job "
        "refuses a cluster that lets a driver in without a token (`vmagent/fleet/cluster_auth.py`)"))
    # CVE-2023-48022: anyone who reaches an open cluster's port runs code on every host.
    ray_allow_unauthenticated: bool = Field(False, description=(
        "`1`: run jobs on a Ray cluster without token auth. Anyone who reaches its port then runs code "
        "on every host, every tenant's projects and keys within reach (CVE-2023-48022): only for a "
        "cluster on a network no one else reaches"))
    # Ray marks a node dead once its health checks fail (Ray's defaults: about 15-30 s).
    ray_node_verdict_s: float = Field(default=60.0, gt=0, description=(
        "when a job's actor dies, how long its shim waits for Ray's word on the actor's node before it "
        "calls the loss the actor's alone (its process killed on a host that lives) rather than the "
        "host's; a cluster with other health checks sets this to match Ray's"))
    # A worker gets this long after SIGTERM to write its report before SIGKILL.
    cancel_grace_s: float = Field(3.0, description=(
        "how long a cancelled job's worker has after SIGTERM to write its report, before SIGKILL"),
        json_schema_extra={"shown_default": "`3` (`15` with `ray`)"})
    # Preview links live this long: a job runs up to two hours and people look later.
    preview_ttl_s: int = Field(24 * 3600, description=(
        "how long a preview link lives"), json_schema_extra={"shown_default": "`86400` (a day)"})
    # ...but no longer than this after their job reaches a final state (done, failed,
    # cancelled): a person watching sees the end, and a link left in a chat, a browser
    # history or a log stops opening the job's screen and terminal soon after.
    preview_grace_s: float = Field(default=300.0, ge=0, description=(
        "how long a preview link lives at most after its job ended (done, failed, cancelled)"))
    # Request bodies above this are refused (413) before they are read. The largest valid
    # body (a 20,000-character task, each character at most 12 bytes as a JSON escape)
    # is under 250 KB; a body is held in memory whole while it is parsed.
    max_body_bytes: int = Field(default=1024 * 1024, ge=4096, description=(
        "request bodies larger than this are refused (413) before they are read"))
    vmd_socket: str | None = Field(None, description="vmd's socket, for the jobs' workers")
    # One question to vmd for a project's history (its `history` verb, for /ask); vmd's own
    # git bound (history_timeout_s, 20 s) comes first, so this is the wait for vmd to answer.
    ask_git_timeout_s: float = Field(default=30.0, gt=0, description=(
        "how long one question to vmd for a project's history (`/ask`) may take"))
    # Model for questions about finished jobs; empty: an extractive answer from the record.
    ollama_url: str = Field("", description=(
        "the Ollama that answers questions about finished jobs (`/jobs/{id}/ask`); empty: an extractive "
        "answer from the record"))
    ask_model: str = Field("", description="the model of those answers")
    # The answer model's context. None: the agent's num_ctx (its config file and
    # environment), which every call to the same model must share -- Ollama reloads a
    # model whose num_ctx changes (tens of seconds for a 32B model). Set it only for an
    # ask_model the agent does not use; never below Ollama's default, which cuts the record.
    ask_num_ctx: int | None = Field(default=None, ge=2048, description=(
        "the answer model's context; set it only for an `ask_model` the agent does not use: Ollama "
        "reloads a model whose context changes"),
        json_schema_extra={"shown_default": "the agent's `num_ctx`"})
    ask_timeout_s: float = Field(120.0, description="how long one answer may take")
    # Extra origins allowed by CORS besides "null" (Open WebUI's sandboxed iframe).
    cors_origins: list[str] = Field(default_factory=list, description=(
        "origins CORS allows besides `null` (Open WebUI's sandboxed iframe)"))
    # Where `vmagent eval --out` keeps its runs (one folder each): GET /evals lists them.
    eval_runs_dir: Path = Field(Path("eval-runs"), description=(
        "where `vmagent eval --out` keeps its runs (a folder each); `GET /evals` lists them"))

    @model_validator(mode="after")
    def _executor_ready(self) -> "ServiceConfig":
        if self.executor == "ray":
            if importlib.util.find_spec("ray") is None:
                raise ValueError("executor \"ray\" needs Ray in the job service's Python: "
                                 "pip install 'vmagent[ray]' (or set executor: local)")
            try:
                self.ray_auth_env()
            except TokenProblem as exc:
                raise ValueError(f"executor \"ray\" runs Ray with token authentication, and {exc}") from None
            if "max_concurrent" not in self.model_fields_set:
                self.max_concurrent = RAY_MAX_CONCURRENT
            if "cancel_grace_s" not in self.model_fields_set:
                self.cancel_grace_s = RAY_CANCEL_GRACE_S
        return self

    def ray_auth_env(self) -> dict[str, str]:
        """The Ray settings of the service's own Ray calls and of each job's shim: token mode
        and the token's place (cluster_auth.auth_environment); nothing with the override and
        no token."""
        environ = dict(os.environ)
        if self.ray_token_file:
            environ.pop(TOKEN_ENV, None)
            environ[TOKEN_PATH_ENV] = self.ray_token_file
        return auth_environment(environ, allow_open=self.ray_allow_unauthenticated)

    def resolved_worker_command(self) -> list[str]:
        """The job process the service starts: the worker itself, or for "ray" the shim,
        which passes the worker command on to the host (only when one is configured: the
        host's own Python is not this one's path)."""
        if self.executor == "ray":
            command = [sys.executable, "-m", "vmagent.service.ray_worker"]
            if self.ray_address:
                command += ["--ray-address", self.ray_address]
            if self.worker_command:
                command += ["--worker-command", json.dumps(self.worker_command)]
            if self.ray_allow_unauthenticated:
                command.append("--allow-unauthenticated")
            if "ray_node_verdict_s" in self.model_fields_set:
                command += ["--node-verdict-s", f"{self.ray_node_verdict_s:g}"]
            return command
        return list(self.worker_command or [sys.executable, "-m", "vmagent.worker"])


# Environment variable -> field; the environment wins over the file. VMAGENT_TOKENS
# ("tok:user,...") adds to the file's tokens, VMAGENT_OPERATORS is "a,b".
ENV_FIELDS = {
    "VMAGENT_SERVICE_TOKEN": "service_token",
    "VMAGENT_TOKENS": "tokens",
    "VMAGENT_PUBLIC_URL": "public_url",
    "VMAGENT_DATA_DIR": "data_dir",
    "OLLAMA_URL": "ollama_url",
    "VMAGENT_ASK_MODEL": "ask_model",
    "VMD_SOCKET": "vmd_socket",
    "VMAGENT_EXECUTOR": "executor",
    "RAY_ADDRESS": "ray_address",
    TOKEN_PATH_ENV: "ray_token_file",
    "VMAGENT_RAY_ALLOW_UNAUTHENTICATED": "ray_allow_unauthenticated",
    "VMAGENT_OPERATORS": "operators",
    "VMAGENT_MAX_CONCURRENT": "max_concurrent",
}


def load_config(path: str | os.PathLike | None = None, **overrides) -> ServiceConfig:
    """File first, then the environment (ENV_FIELDS), then overrides."""
    data: dict = {}
    if path:
        text = Path(path).read_text()
        if str(path).endswith((".yml", ".yaml")):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    env = os.environ
    for name, key in ENV_FIELDS.items():
        value = env.get(name)
        if not value:
            continue
        if key == "tokens":
            tokens = dict(data.get("tokens") or {})
            for pair in value.split(","):
                token, _, user = pair.strip().partition(":")
                if token and user:
                    tokens[token] = user
            data["tokens"] = tokens
        elif key == "operators":
            data["operators"] = [user.strip() for user in value.split(",") if user.strip()]
        elif key == "ray_allow_unauthenticated":
            data[key] = value.lower() in ("1", "true", "yes")
        elif key == "max_concurrent":
            data["max_concurrent"] = int(value)
        else:
            data[key] = value
    data.update({k: v for k, v in overrides.items() if v is not None})
    return ServiceConfig.model_validate(data)
