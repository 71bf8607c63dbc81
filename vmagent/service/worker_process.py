"""One job's worker process as the job service sees it: the environment it starts with
(none of the service's secrets), the spec of its job file (vmagent/job_file.py: what to
run, a fresh job or a resume, the answer), and the service's bookkeeping of a live one (its
pid, whether it still runs, the cancel asked, the frames read so far). The queue that starts workers and reads
their frames is vmagent/service/workers.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from vmagent.config import CONFIG_ENV, AgentConfig
from vmagent.job_file import JobSpec
from vmagent.prompts import ENV_VAR as PROMPTS_ENV

from .config import ServiceConfig
from .frames import FrameReader, OutputCap

# A worker inherits only these from the service's environment: what Python, the turn loop,
# the model client and vmd's client read. The service holds every user's token
# (VMAGENT_TOKENS, VMAGENT_SERVICE_TOKEN) and a deployment may hold more (GITEA_TOKEN);
# a worker runs work a model chose and needs none of them.
WORKER_ENV = frozenset({
    "PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH", "SSL_CERT_FILE",
    "SSL_CERT_DIR", "VMD_SOCKET", "OLLAMA_HOST", "VMAGENT_SCREEN_WATCH_S",
})
WORKER_ENV_PREFIXES = ("LC_",)
# Never passed on, even if a future agent setting were named like one of them.
SECRET_ENV = frozenset({"VMAGENT_SERVICE_TOKEN", "VMAGENT_TOKENS", "GITEA_TOKEN"})


def worker_env_names() -> frozenset[str]:
    """WORKER_ENV and the agent settings the worker reads (vmagent/config.py, prompts.py)."""
    settings = {f"VMAGENT_{name.upper()}" for name in AgentConfig.model_fields}
    return (WORKER_ENV | settings | {CONFIG_ENV, PROMPTS_ENV, "VMAGENT_MODEL"}) - SECRET_ENV


def worker_environment(config: ServiceConfig, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a worker process starts with: the allowed part of `environ`
    (the service's own by default), unbuffered output, and the configured vmd socket."""
    environ = os.environ if environ is None else environ
    names = worker_env_names()
    env = {key: value for key, value in environ.items()
           if (key in names or key.startswith(WORKER_ENV_PREFIXES)) and key not in SECRET_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if config.vmd_socket:
        env["VMD_SOCKET"] = config.vmd_socket
    return env


def job_spec(job: dict) -> JobSpec:
    """The spec of the job file (vmagent/job_file.py) from the job's row in the store."""
    return JobSpec(task=job["task"], os=job["os"], project=job["project"], owner=job["owner"],
                   chat_id=job["chat_id"], model=job["model"], web=bool(job.get("web", 1)))


def pid_runs_job(pid: int | None, job_dir: Path) -> bool:
    """True if `pid` is alive and is this job's worker (a reused pid is not)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not Path("/proc/self").exists():  # no procfs: a live pid is all we can know
        return True
    try:
        raw = cmdline.read_bytes()
    except OSError:
        return False
    if not raw:  # a zombie has no cmdline: it is dead for our purposes
        return False
    return str(job_dir).encode() in raw


class Worker:
    """What the service knows about one live worker process."""

    def __init__(self, job_id: str, pid: int, popen: subprocess.Popen | None):
        self.job_id = job_id
        self.pid = pid
        self.popen = popen
        self.cancel_requested = False
        self.got_done = False
        self.preview_opened = False  # preview_ready is set at the first frame read
        self.exit_code: int | None = None
        # Made at the first read, from the job's stored offset and output count.
        self.reader: FrameReader | None = None
        self.output: OutputCap | None = None

    def alive(self, job_dir: Path) -> bool:
        if self.popen is not None:
            code = self.popen.poll()
            if code is not None:
                self.exit_code = code
                return False
            return True
        return pid_runs_job(self.pid, job_dir)
