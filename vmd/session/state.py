"""What a session keeps on disk: `<state_dir>/sessions/<id>/session.json`, everything a
restarted vmd needs to carry on, read by vmd/session/registry.py (adoption), vmd/server/lifecycle.py and
`vmd sessions` (vmd/server/session_list.py) without a live session."""

from __future__ import annotations

import secrets
import time
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, Field

from vmd.contract.policy import SessionStateName
from vmd.machines.host import LOCAL
from vmd.projects.push_state import PushState


def new_session_id() -> str:
    return datetime.now(timezone.utc).strftime("s-%Y%m%d-%H%M%S-") + secrets.token_hex(3)


class SessionState(BaseModel):
    id: str
    os: str
    os_family: str | None = None  # the image's (vmd/machines/port.py MachineFactory.os_family)
    desktop: bool | None = None  # whether the image has a desktop (MachineFactory.image_desktop)
    project: str | None = None
    owner: str = ""
    task: str = ""
    chat_id: str = ""
    created: float = Field(default_factory=time.time)
    state: SessionStateName = "booting"
    resume_state: SessionStateName = "booting"  # where question/unfreeze go back to
    machine_name: str = ""
    # The host its guest runs on (vmd/machines/host.py `Host.name`); a session.json from
    # before hosts had names ran on the local host.
    host: str = LOCAL
    machine_created: bool = False
    project_dir: str | None = None
    storage: str = ""
    base_commit: str | None = None
    branch: str = "main"  # the Gitea branch the history came from and goes back to
    tasks: list[dict] = []
    runs: int = 0
    steps: int = 0  # the verbs served that count as steps (POLICY counts_as_step)
    # The agent's model turns and its model's tool calls, as it last told them
    # (session_status); None while no agent told any.
    turns: int | None = None
    tool_calls: int = 0
    question: str = ""
    unfreeze_request: str = ""
    answer: str = ""
    egress: bool = False
    cancelled: bool = False
    boot_seconds: float | None = None
    # How the machine came: "warm" (restored from vmd's pool, vmd/machines/warm_pool.py) or "cold"
    # (booted); None until it was made. `came_note`: why it came cold when warm was tried.
    machine_came: Literal["warm", "cold"] | None = None
    came_note: str | None = None
    facts: dict = {}
    outcome: dict | None = None
    verifications: list[dict] = []  # every run of the agent's check, in order
    baseline_refused: bool = False  # a finish was refused once for a check that proves nothing
    summary: str = ""
    close: dict | None = None
    push: PushState | None = None  # the push at close and its retries (vmd/projects/push_state.py, retried by vmd/server/push_retrier.py)
    # Connections bound to the session as vmd last saved them, and since when none is
    # (epoch seconds): what `vmd sessions` shows; the reaper counts live ones in memory.
    clients: int = 0
    detached_at: float | None = None
    waiting_since: float | None = None  # when the session began to wait for a person
