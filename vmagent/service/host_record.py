"""DIR/host.json: where a job of the "ray" executor runs (or last ran) and each run before,
written by its shim (vmagent/service/ray_worker.py) and read by the service's calls to the
job's vmd (job_vmd.py). Private: it names the job's hosts."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, Field

from .private_files import write_private


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class HostRun(BaseModel):
    host: str | None = None
    node_id: str | None = None
    started: str = ""
    ended: str = ""
    why: str = ""


class HostRecord(BaseModel):
    """DIR/host.json: where the job runs (or last ran) and each run before."""
    node_id: str | None = None
    host: str | None = None
    runs: list[HostRun] = Field(default_factory=list)

    @classmethod
    def load(cls, job_dir: Path) -> "HostRecord":
        try:
            return cls.model_validate_json((job_dir / "host.json").read_text())
        except (OSError, ValueError):
            return cls()

    def save(self, job_dir: Path) -> None:
        write_private(job_dir / "host.json", self.model_dump_json(indent=2).encode())
