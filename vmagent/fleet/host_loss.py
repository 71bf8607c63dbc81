"""How a job's run on a host ends when the host does not end it: Ray's verdict on a dead
actor (its host lost, or the actor alone, its host alive), what the shim does about the
guest an actor left on a live host, and why a node Ray offers cannot take a job at all.

Used by the "ray" executor's shim (vmagent/service/ray_worker.py). Ray is imported only by
the functions that ask it (placement.py, on_host.py).
"""

from __future__ import annotations

import time

from vmagent.link import VmdCall

from . import placement
from .host_labels import vmagent_version
from .on_host import HostUnreachable, call_on_host

# How long the shim waits for Ray to say whether the node of an actor that died lives (the
# service's ray_node_verdict_s): Ray marks a node dead after its health checks fail (about
# 15-30 s with Ray's defaults); an actor whose node still lives after this died alone.
NODE_VERDICT_S = 60.0
# An actor Ray calls unavailable (ActorUnavailableError: its process restarting, or the
# network to its node) on a node that lives is waited for this long before it counts as dead.
UNAVAILABLE_GRACE_S = 60.0


class Lost(Exception):
    """The job's machine went away with its host (kind "host": Ray lost the host's node), or
    with the job's actor alone (kind "actor": its process died while the host lives)."""

    def __init__(self, host: str | None, why: str, kind: str = "host"):
        self.kind = kind
        super().__init__(f"host {host} lost: {why}" if kind == "host" else
                         f"the job's process on host {host} died while the host lives: {why}")
        self.why = why
        # What the re-run tells the model (vmagent/loop/words.py host_lost puts it in brackets).
        self.sentence = f"{why} on host {host}"

    @property
    def record_why(self) -> str:
        """host.json's word for the run's end."""
        return f"lost: {self.why}" if self.kind == "host" else f"actor died, host alive: {self.why}"


class Unusable(Exception):
    """The node Ray chose cannot take the job (another vmagent version, its vmd not
    answering, no labels): avoided, and the job placed again."""


def verdict(host: str, node_id: str, exc: BaseException, wait_s: float = NODE_VERDICT_S) -> "Lost":
    """Host lost or actor died: Ray's word on the node decides, waited for up to wait_s (an
    actor's death is often told before its node's)."""
    why = placement.why_lost(exc)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not placement.node_alive(node_id):
            return Lost(host, why if "node" in why else "its Ray node died")
        time.sleep(1.0)
    return Lost(host, f"its actor died ({why})", kind="actor")


def close_left_session(node_id: str, host: str, session_id: str, ray_address: str | None) -> str | None:
    """The host lives, and so does the guest the dead worker drove: closed now (commit, push,
    destroy), before the re-run takes a slot, so the host never runs both. None when closed,
    else why not."""
    calls = [VmdCall(verb="session_attach", params={"session_id": session_id}), VmdCall(verb="session_close")]
    try:
        answers = call_on_host(node_id, calls, 300, host=host, ray_address=ray_address, stop_at_error=True)
    except HostUnreachable as exc:
        return str(exc)
    return next((a.error for a in answers if a.error), None)


def unusable_because(where: dict) -> str | None:
    """Why the node a JobHost actor landed on cannot run a job: no vmagent labels, another
    vmagent version (the worker, its loop and verbs are the host's code), or its vmd not
    answering at the labelled socket. None: usable."""
    if where.get("problem"):
        return str(where["problem"])
    theirs, ours = where.get("vmagent_version"), vmagent_version()
    if theirs != ours:
        return (f"it runs vmagent {theirs or 'of an unknown, older version'} and the job service {ours}: "
                "install the job service's version on the host and restart its Ray node")
    return None
