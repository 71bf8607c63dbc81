"""DIR/job.json: what one job's worker runs, the one file the job service hands it.

The service writes it for a fresh run, a resume or the close of a waiting guest
(vmagent/service/workers.py); with the Ray executor the shim (vmagent/service/ray_worker.py)
reads it and the host's actor writes its copy beside the worker it starts
(vmagent/fleet/job_host.py), with a rerun's `lost` and that host's vmd socket; the worker
reads it (vmagent/worker.py). All of them through `JobFile.write` and `JobFile.read`.

`JobSpec` is what a person asked for, as the turn loop runs it (vmagent/loop/).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from vmagent.atomic_file import replace_text
from vmd.contract.params import HiddenCheck

JOB_FILE = "job.json"


class JobSpec(BaseModel):
    task: str
    os: str = "debian"
    project: str | None = None
    owner: str = ""
    chat_id: str = ""
    model: str | None = None
    # The person's switch for the web tools (the Open WebUI tool's web_tools user valve):
    # False offers them no web tool, whatever the operator's settings allow.
    web: bool = True
    # `vmagent eval` only: a check vmd runs in the guest after the agent's last turn and
    # before the close (the hidden_check verb); never shown to the model.
    hidden_check: HiddenCheck | None = None


class JobFileUnreadable(ValueError):
    """DIR/job.json is missing, not JSON, or not a job file; the message says which and where."""


class JobFile(BaseModel):
    # A field this reader does not know is left aside, not refused: with the Ray executor
    # the service that wrote the file and the host that runs its worker may be one version
    # apart while a cluster is upgraded.
    model_config = ConfigDict(extra="ignore")

    job_id: str | None = None
    spec: JobSpec
    # run: a fresh job; resume: the same job after a person answered (its transcript holds
    # the rest); rerun: the job on a new machine after its host was lost (vmagent/loop/rerun.py).
    mode: Literal["run", "resume", "rerun"] = "run"
    # Set from the start: the job is to end at once (a waiting guest closed with its report).
    cancel: bool = False
    vmd_socket: str | None = None  # None: VMD_SOCKET of the worker's environment, else vmd's default
    answer: str | None = None  # a resume's (or a rerun's) answer from the person
    approved: bool | None = None  # ... and the person's decision on an approval request
    lost: str = ""  # a rerun's: what happened to the host the job was on, said to the model

    @classmethod
    def read(cls, job_dir: Path) -> "JobFile":
        path = Path(job_dir) / JOB_FILE
        try:
            return cls.model_validate_json(path.read_bytes())
        except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            raise JobFileUnreadable(f"{path}: {exc}") from None

    def write(self, job_dir: Path) -> None:
        """The file written whole (readers see the old one or the new one), mode 0600."""
        replace_text(Path(job_dir) / JOB_FILE, self.model_dump_json(indent=2))
