"""The Ray cluster's lock: token authentication, on by default (issue 38).

A Ray cluster runs any code a driver sends it, on every node (the ShadowRay class,
CVE-2023-48022): with the vmd hosts in it, a stranger who reaches its port reaches every
tenant's projects, tasks and keys. Ray 2.52+ has token authentication: every process of
the cluster (head, nodes, drivers) runs with RAY_AUTH_MODE=token and the same token, and
Ray refuses a driver or a node that does not present it. Ray 2.60 leaves it off unless
asked, so vmagent asks, everywhere:

- the token: a file, made once at the head's first start (`make_token`, 0600, its
  folder 0700 when made here), copied to each host; never printed, logged or put on a
  command line (Ray reads it from RAY_AUTH_TOKEN_PATH);
- `auth_environment`: what a Ray process of vmagent's (the job service's driver, each
  job's shim, `ray_node`'s `ray start`) runs with;
- `probe`: what the cluster does with a client that has no token (refused: the cluster
  demands it) or with this host's token (accepted, or refused: a wrong token). Ray has no
  public call that says a cluster's auth mode, so the probe asks the cluster for real: Ray's
  own `ray status --address`, in a child process (a GCS client: it needs no Ray node where
  it runs, so a host asks before it joins), told apart by what Ray answers: the status, or
  its AuthenticationError;
- `require_token_cluster`: the job service refuses an open cluster (each job's shim asks
  before it places the job) unless the operator set `ray_allow_unauthenticated`.
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
# Ray's own default (ray/_private/authentication/authentication_token_setup.py): a token
# there is found by every Ray command of that user without a setting.
DEFAULT_TOKEN_PATH = Path("~/.ray/auth_token")
# How Ray 2.60 says the GCS turned a client away for its token: `ray status` ends on
# ray.exceptions.AuthenticationError ("RPC error: InvalidAuthToken: ..."); Ray's C++ client
# logs gRPC's status name, "Unauthenticated". tests/vmagent/fleet/test_ray_auth.py fails when Ray rewords.
REFUSED_WORDS = ("AuthenticationError", "InvalidAuthToken", "Unauthenticated")
# A probe's wait for Ray to answer: `ray status` took 2-4 s on an idle 2-core machine (its
# import is most of it); a loaded CI machine several times that.
PROBE_WAIT_S = 45.0
LOOPBACK_SETTING = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # as placement.keep_loopback
TOKEN_BYTES = 32


class TokenProblem(RuntimeError):
    """The token file is missing, empty or readable by others: the sentence says what to do."""


class OpenCluster(RuntimeError):
    """The cluster runs without authentication and the operator did not allow it."""


class ProbeAnswer(BaseModel):
    # refused: Ray turned the driver away for its token; connected: it got in; silent: no
    # answer either way within the wait (the head is down, or the address is wrong).
    outcome: Literal["refused", "connected", "silent"]
    seconds: float
    detail: str = ""  # for "silent": the end of what the probe printed


def token_path(environ: dict[str, str] | None = None) -> Path:
    """Where Ray reads the token from: RAY_AUTH_TOKEN_PATH, else Ray's default file."""
    environ = os.environ if environ is None else environ
    return Path(environ.get(TOKEN_PATH_ENV) or DEFAULT_TOKEN_PATH).expanduser()


def make_token(path: Path) -> bool:
    """A new token at `path` (0600) unless one is there; True when made. Its folder is made
    0700. The token is never printed: the caller says only where it is."""
    path = Path(path).expanduser()
    if path.exists():
        check_token_file(path)
        return False
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(TOKEN_BYTES))
    os.chmod(path, 0o600)  # whatever the umask
    return True


def check_token_file(path: Path) -> None:
    """The token file exists, is a file, holds a token and is readable by its owner only."""
    path = Path(path).expanduser()
    try:
        info = path.stat()
    except OSError as exc:
        raise TokenProblem(
            f"the Ray token file {path} cannot be read ({exc.strerror}): the head makes it at its first "
            "start (`vmagent ray-node head`); copy it to this machine with mode 0600 "
            "(docs/scale-out.md)") from None
    if not path.is_file():
        raise TokenProblem(f"the Ray token file {path} is not a file")
    if info.st_mode & 0o077:
        raise TokenProblem(
            f"the Ray token file {path} is readable by others (mode {info.st_mode & 0o777:04o}): anyone who "
            f"reads it can run code on every host of the cluster. `chmod 600 {path}`, and make a new token "
            "if others may have read it")
    try:
        empty = not path.read_text().strip()
    except OSError as exc:
        raise TokenProblem(f"the Ray token file {path} cannot be read ({exc.strerror})") from None
    if empty:
        raise TokenProblem(f"the Ray token file {path} is empty: copy the head's token there")


def has_token(environ: dict[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return bool(environ.get(TOKEN_ENV)) or token_path(environ).is_file()


def auth_environment(environ: dict[str, str] | None = None, allow_open: bool = False) -> dict[str, str]:
    """The Ray settings a process of vmagent's runs with: token mode and where the token is.
    Without a token, an error that says how to get one; with `allow_open` (the operator's
    override for a cluster without auth), no token is needed and none is asked for."""
    environ = os.environ if environ is None else environ
    if environ.get(TOKEN_ENV):
        return {MODE_ENV: "token", TOKEN_ENV: environ[TOKEN_ENV]}
    path = token_path(environ)
    if path.is_file():
        check_token_file(path)
        return {MODE_ENV: "token", TOKEN_PATH_ENV: str(path)}
    if allow_open:
        return {}
    raise TokenProblem(
        f"no Ray token: neither {TOKEN_ENV} nor {TOKEN_PATH_ENV} is set and {path} does not exist. The "
        "cluster's head makes the token at its first start (`vmagent ray-node head`); "
        f"give the job service its path as {TOKEN_PATH_ENV} (docs/scale-out.md)")


def use_auth(allow_open: bool = False) -> None:
    """Puts auth_environment into this process's environment, before Ray is imported here
    (Ray reads RAY_AUTH_MODE when it starts its core; a later change is not seen)."""
    env = auth_environment(allow_open=allow_open)
    if "ray" in sys.modules and env.get(MODE_ENV) != os.environ.get(MODE_ENV):
        raise RuntimeError("Ray was imported before its authentication was set; use_auth must come first")
    os.environ.update(env)


def ray_command() -> str:
    """Ray's CLI beside this Python (a venv's bin), else the first on PATH."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


def probe(address: str, token: dict[str, str] | None = None, wait_s: float = PROBE_WAIT_S) -> ProbeAnswer:
    """`ray status` in a child process asks the cluster at `address`: with no token at all
    (token None), or with `token` (auth_environment's settings). How Ray answered."""
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "LANG", "TZ", "PYTHONPATH", "RAY_TMPDIR") or k.startswith("LC_")}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vmagent-ray-probe-") as home:
        env["HOME"] = home  # no ~/.ray/auth_token of the caller's is found by accident
        env.update(token or {MODE_ENV: "disabled"})
        if address.rpartition(":")[0] in ("127.0.0.1", "localhost"):
            env[LOOPBACK_SETTING] = "0"  # a head on loopback stays there (placement.keep_loopback)
        child = subprocess.Popen([ray_command(), "status", f"--address={address}"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=env, cwd=home, start_new_session=True)
        try:
            outcome, tail = _watch(child, began + wait_s)
        finally:
            _end(child)
    return ProbeAnswer(outcome=outcome, seconds=round(time.monotonic() - began, 2), detail=tail)


def _watch(child: subprocess.Popen, deadline: float) -> tuple[str, str]:
    """Reads the child's output until it is refused, ends or the deadline passes: an end
    with exit 0 is the cluster's status, given without a word about the token."""
    assert child.stdout is not None and child.stderr is not None
    streams = {child.stdout.fileno(): b"", child.stderr.fileno(): b""}
    open_fds = set(streams)
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(list(open_fds), [], [], min(left, 0.5))
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            streams[fd] = (streams[fd] + chunk)[-20000:]
        if any(word.encode() in streams[child.stderr.fileno()] for word in REFUSED_WORDS):
            return "refused", ""
    if not open_fds and child.wait() == 0:
        return "connected", ""
    text = streams[child.stderr.fileno()].decode("utf-8", "replace")
    return "silent", " ".join(text.split())[-300:]


def _end(child: subprocess.Popen) -> None:
    """The probe's driver and whatever it started, gone (its own process group)."""
    if child.poll() is None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    child.wait()
    for stream in (child.stdout, child.stderr):
        if stream is not None:
            stream.close()


def open_cluster_sentence(address: str) -> str:
    return (f"The Ray cluster at {address} runs without authentication: anyone who reaches its port can "
            "run code on every host, and with it reach every tenant's projects, tasks and keys (the "
            "ShadowRay class, CVE-2023-48022). Start its head and nodes with token authentication "
            "(`vmagent ray-node`, docs/scale-out.md); only if no one else can reach the "
            "cluster's network, set ray_allow_unauthenticated (VMAGENT_RAY_ALLOW_UNAUTHENTICATED=1)")


def require_token_cluster(address: str, allow_open: bool = False, wait_s: float = PROBE_WAIT_S) -> ProbeAnswer:
    """Raises OpenCluster when a driver without a token gets into the cluster (and the
    operator did not allow that). A silent probe is not a verdict: the caller's own
    connection says why the cluster cannot be reached."""
    answer = probe(address, None, wait_s)
    if answer.outcome == "connected" and not allow_open:
        raise OpenCluster(open_cluster_sentence(address))
    return answer
