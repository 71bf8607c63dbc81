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
    data_dir: Path = Path(".state/service")
    host: str = "127.0.0.1"
    port: int = 8700
    # The address browsers and Open WebUI use to reach this service; the preview URL is
    # built from it. Empty: taken from the request that created the job.
    public_url: str = ""
    # token -> user id. A user sees, answers and cancels only jobs they own.
    tokens: dict[str, str] = Field(default_factory=dict)
    # Open WebUI's token: with it (and only with it) the X-OpenWebUI-User-* headers name the user.
    service_token: str = ""
    # The users (as their tokens name them) who may see the fleet: GET /hosts (every host,
    # its load and errors) and GET /evals* (the runs' reports). VMAGENT_OPERATORS="a,b".
    # Empty: nobody; the routes answer 403 with a sentence naming this setting.
    operators: list[str] = Field(default_factory=list)
    # How long one listing of the hosts is served again: each listing asks every host.
    hosts_cache_s: float = Field(default=5.0, ge=0)
    # Each job holds a guest; more than this at once starves the host, so the rest queue.
    max_concurrent: int = Field(default=2, ge=1)
    # The job process. Default: the real worker with the interpreter running the service.
    # With the "ray" executor it is the worker the host runs (default: the host's own Python).
    worker_command: list[str] | None = None
    # "local": each job's worker runs here, against vmd_socket. "ray": each job runs on a vmd
    # host of the Ray cluster at ray_address (docs/scale-out.md), through a local shim
    # (vmagent/service/ray_worker.py). Needs `pip install 'vmagent[ray]'`.
    executor: Literal["local", "ray"] = "local"
    # The Ray cluster's head (host:port); empty: RAY_ADDRESS, or the cluster `ray start` made here.
    ray_address: str = ""
    # The cluster's token file (RAY_AUTH_TOKEN_PATH, Ray's own setting; empty: RAY_AUTH_TOKEN, else
    # Ray's default ~/.ray/auth_token). The service and its shims run Ray with token auth, and a
    # job refuses a cluster that lets a driver in without a token (vmagent/fleet/cluster_auth.py).
    ray_token_file: str = ""
    # The override for a cluster without auth (VMAGENT_RAY_ALLOW_UNAUTHENTICATED=1): anyone who
    # reaches its port runs code on every host, every tenant's projects and keys within reach
    # (CVE-2023-48022). Only for a cluster on a network no one else reaches.
    ray_allow_unauthenticated: bool = False
    # When a job's actor dies, how long its shim waits for Ray's word on the actor's node
    # before it calls the loss the actor's alone (its process killed on a host that lives)
    # rather than the host's. Ray marks a node dead once its health checks fail (Ray's
    # defaults: about 15-30 s); a cluster with other health checks sets this to match.
    ray_node_verdict_s: float = Field(default=60.0, gt=0)
    # A worker gets this long after SIGTERM to write its report before SIGKILL.
    cancel_grace_s: float = 3.0
    # Preview links live this long: a job runs up to two hours and people look later.
    preview_ttl_s: int = 24 * 3600
    # ...but no longer than this after their job reaches a final state (done, failed,
    # cancelled): a person watching sees the end, and a link left in a chat, a browser
    # history or a log stops opening the job's screen and terminal soon after.
    preview_grace_s: float = Field(default=300.0, ge=0)
    # Request bodies above this are refused (413) before they are read. The largest valid
    # body (a 20,000-character task, each character at most 12 bytes as a JSON escape)
    # is under 250 KB; a body is held in memory whole while it is parsed.
    max_body_bytes: int = Field(default=1024 * 1024, ge=4096)
    vmd_socket: str | None = None
    # One question to vmd for a project's history (its `history` verb, for /ask); vmd's own
    # git bound (history_timeout_s, 20 s) comes first, so this is the wait for vmd to answer.
    ask_git_timeout_s: float = Field(default=30.0, gt=0)
    # Model for questions about finished jobs; empty: an extractive answer from the record.
    ollama_url: str = ""
    ask_model: str = ""
    # The answer model's context. None: the agent's num_ctx (its config file and
    # environment), which every call to the same model must share -- Ollama reloads a
    # model whose num_ctx changes (tens of seconds for a 32B model). Set it only for an
    # ask_model the agent does not use; never below Ollama's default, which cuts the record.
    ask_num_ctx: int | None = Field(default=None, ge=2048)
    ask_timeout_s: float = 120.0
    # Extra origins allowed by CORS besides "null" (Open WebUI's sandboxed iframe).
    cors_origins: list[str] = Field(default_factory=list)
    # Where `vmagent eval --out` keeps its runs (one folder each): GET /evals lists them.
    eval_runs_dir: Path = Path("eval-runs")

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


def load_config(path: str | os.PathLike | None = None, **overrides) -> ServiceConfig:
    """File first, then environment (VMAGENT_SERVICE_TOKEN, VMAGENT_TOKENS="tok:user,..."), then overrides."""
    data: dict = {}
    if path:
        text = Path(path).read_text()
        if str(path).endswith((".yml", ".yaml")):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    env = os.environ
    if env.get("VMAGENT_SERVICE_TOKEN"):
        data["service_token"] = env["VMAGENT_SERVICE_TOKEN"]
    if env.get("VMAGENT_TOKENS"):
        tokens = dict(data.get("tokens") or {})
        for pair in env["VMAGENT_TOKENS"].split(","):
            token, _, user = pair.strip().partition(":")
            if token and user:
                tokens[token] = user
        data["tokens"] = tokens
    for key, name in (("public_url", "VMAGENT_PUBLIC_URL"), ("data_dir", "VMAGENT_DATA_DIR"),
                      ("ollama_url", "OLLAMA_URL"), ("ask_model", "VMAGENT_ASK_MODEL"),
                      ("vmd_socket", "VMD_SOCKET"), ("executor", "VMAGENT_EXECUTOR"),
                      ("ray_address", "RAY_ADDRESS"), ("ray_token_file", TOKEN_PATH_ENV)):
        if env.get(name):
            data[key] = env[name]
    if env.get("VMAGENT_OPERATORS"):
        data["operators"] = [name.strip() for name in env["VMAGENT_OPERATORS"].split(",") if name.strip()]
    if env.get("VMAGENT_RAY_ALLOW_UNAUTHENTICATED"):
        data["ray_allow_unauthenticated"] = env["VMAGENT_RAY_ALLOW_UNAUTHENTICATED"].lower() in ("1", "true", "yes")
    if env.get("VMAGENT_MAX_CONCURRENT"):
        data["max_concurrent"] = int(env["VMAGENT_MAX_CONCURRENT"])
    data.update({k: v for k, v in overrides.items() if v is not None})
    return ServiceConfig.model_validate(data)
