"""The shim: `python -m vmagent.service.ray_worker --job-dir DIR`, the job process of the
"ray" executor.

To the job service it is a worker like vmagent.worker: it reads DIR/job.json, writes NDJSON
frames on stdout (the last one `done`), keeps DIR/transcript.json, and SIGTERM cancels. So
the service's queue, restart re-attach, salvage and cancel work unchanged. The job itself
runs on a vmd host Ray chooses: the shim creates a JobHost actor (vmagent/fleet/job_host.py)
holding one `vm_slot` of the job's OS family there, starts the real worker through it and
relays its frames and transcript snapshots. DIR/host.json says where the job ran.

A host lost while the job runs (its actor or node died in Ray) costs the job its guest: the
shim runs it again on another host in mode "rerun" (vmagent/loop/rerun.py: a new machine with the
project as of its last pushed checkpoint and the transcript so far), at most MAX_RERUNS
times; then it ends failed with a report naming each host and why. A resume goes back to
the host whose suspended guest waits (hard node affinity), or reruns when that host is gone.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from vmagent.fleet import cluster_auth, host_loss, placement
from vmagent.fleet.host_loss import NODE_VERDICT_S, UNAVAILABLE_GRACE_S, Lost, Unusable, unusable_because
from vmagent.job_file import JobFile, JobFileUnreadable
from vmagent.worker import FrameWriter, failed_outcome

from .config import ServiceConfig
from .host_record import HostRecord, HostRun, now
from .private_files import write_private
from .worker_process import worker_environment

MAX_RERUNS = 2
# How long one `read` waits on the host for a frame; a get that takes far longer than this
# means the host stopped answering, and the shim asks Ray whether its node still lives.
READ_WAIT_S = 1.0
READ_GRACE_S = 30.0
# A job's actor not placed after this long is said to be waiting for a host.
WAITING_AFTER_S = 1.0
# An actor can die before it ever ran (its queue was on a node that died): placed again.
MAX_PLACEMENT_TRIES = 5


class Unplaced(Exception):
    """The actor died before it was placed: nothing ran, place it again."""


def shipped_environment() -> dict[str, str]:
    """What the worker on the host starts with: what the service gave this shim (its
    worker_environment), less VMD_SOCKET, which is this machine's vmd, not the host's."""
    env = worker_environment(ServiceConfig(), environ=dict(os.environ))
    env.pop("VMD_SOCKET", None)
    return env


class Shim:
    def __init__(self, job_dir: Path, job: JobFile, frames: FrameWriter, cancel: threading.Event,
                 worker_command: list[str] | None, ray_address: str | None, allow_open: bool = False,
                 node_verdict_s: float = NODE_VERDICT_S):
        self.job_dir, self.job, self.frames, self.cancel = job_dir, job, frames, cancel
        self.worker_command = worker_command
        self.ray_address = ray_address
        self.allow_open = allow_open
        self.node_verdict_s = node_verdict_s
        # Nodes found unusable for this job: node id -> "host X: why".
        self.avoid: dict[str, str] = {}
        self.last_place_error = ""
        self.session_id: str | None = None  # the vmd session of the run being followed
        self.record = HostRecord.load(job_dir)
        self.os_name = job.spec.os or "debian"
        self.ray = None

    def emit_status(self, text: str) -> None:
        self.frames.write({"type": "status", "text": text})

    # --- the job's runs --------------------------------------------------------------

    def run(self) -> dict:
        """Runs the job to its end on the hosts Ray gives it; the outcome of the done frame."""
        address = self.ray_address or os.environ.get("RAY_ADDRESS") or "auto"
        try:
            cluster_auth.require_token_cluster(address, self.allow_open)
        except cluster_auth.OpenCluster as exc:
            return failed_outcome(f"# Job failed\n\n{exc}.")
        self.ray = placement.connect(self.ray_address)
        # ray.init puts its own SIGTERM handler in (sys.exit): SIGTERM is the job's cancel.
        _cancel_on_signals(self.cancel)
        resources = placement.job_resources(self.os_name)
        if not placement.offered_by_any(resources):
            return failed_outcome(
                f"# Job failed\n\nNo host in the Ray cluster offers {', '.join(resources)} (a "
                f"guest slot for {self.os_name!r}), so the job could never start. Start a vmd host "
                "with those resources (docs/scale-out.md) and run the job again.")
        job = self.job
        affinity = None
        if job.mode == "resume":
            job, affinity, ended = self._resume_target(job)
            if ended is not None:
                return ended
        losses: list[str] = []
        while True:
            try:
                return self._one_run(job, affinity)
            except Lost as exc:
                losses.append(str(exc))
                self.emit_status(str(exc))
                if self.cancel.is_set():
                    return self._cancelled_outcome(f"it was cancelled when {exc}")
                if len(losses) > MAX_RERUNS:
                    return self._lost_too_often(losses)
                job = self._rerun_job(job, exc.sentence)
                affinity = None

    def _resume_target(self, job: JobFile) -> tuple[JobFile, str | None, dict | None]:
        """A resume goes to the node whose guest waits; that node gone: a rerun (or, for a
        cancel, the end: there is no guest left to close)."""
        node_id, host = self.record.node_id, self.record.host
        if node_id and placement.node_alive(node_id):
            return job, node_id, None
        if not node_id:  # no record (a job from before the ray executor): any host
            return job, None, None
        lost = f"host {host} is gone from the cluster with the machine that waited for an answer"
        self.emit_status(f"host {host} lost: it is gone from the cluster")
        self._waiting_run_lost(lost)
        if job.cancel:
            return job, None, self._cancelled_outcome(f"its host {host} was gone, and its machine with it")
        return self._rerun_job(job, lost), None, None

    def _waiting_run_lost(self, lost: str) -> None:
        """The last run ended waiting for a person; its host went after: its record says so."""
        if self.record.runs:
            last = self.record.runs[-1]
            last.why = f"{last.why or 'ended'}, then lost: {lost}"
            self.record.save(self.job_dir)

    def _rerun_job(self, job: JobFile, lost: str) -> JobFile:
        """The job again on a new machine, from its last transcript; with none, from scratch."""
        if not (self.job_dir / "transcript.json").exists():
            return job.model_copy(update={"mode": "run"})
        return job.model_copy(update={"mode": "rerun", "lost": lost})

    def _one_run(self, job: JobFile, affinity: str | None) -> dict:
        tries = 0
        while tries < MAX_PLACEMENT_TRIES:
            if not affinity and not placement.offered_by_any(placement.job_resources(self.os_name),
                                                             list(self.avoid)):
                return self._no_usable_host()
            try:
                actor, where = self._place(affinity)
                break
            except Unusable:
                continue  # that node is avoided now: the loop ends when none is left
            except Unplaced:
                tries += 1
                if affinity and not placement.node_alive(affinity):
                    # The node was still alive when the resume looked (_resume_target): Ray
                    # had not yet noticed its death, seen when the answer came at once.
                    lost = Lost(self.record.host, "it died before the job resumed there")
                    self._waiting_run_lost(str(lost))
                    raise lost
                continue
        else:
            return failed_outcome("# Job failed\n\nRay could not place the job on any host "
                                  f"({MAX_PLACEMENT_TRIES} tries; the last: {self.last_place_error or 'no error'}); "
                                  "see the job's worker.log.")
        if actor is None:
            return where  # cancelled while waiting, or a host without labels
        try:
            return self._follow(actor, where, job)
        finally:
            try:
                self.ray.get(actor.cleanup.remote(), timeout=10)
            except Exception:  # a lost host cleans nothing up; Ray's kill below is enough
                pass
            self.ray.kill(actor, no_restart=True)

    def _place(self, affinity: str | None):
        """(actor, where) once Ray placed it; (None, outcome) when the job ended meanwhile.
        Unusable when the node cannot take the job (it is avoided from then on)."""
        avoid = [] if affinity else list(self.avoid)
        actor = placement.job_host_class().options(
            **placement.actor_options(self.os_name, affinity, avoid)).remote()
        ref = actor.where.remote()
        began, said_waiting, checked = time.monotonic(), False, time.monotonic()
        while True:
            ready, _ = self.ray.wait([ref], timeout=0.25)
            if ready:
                break
            if self.cancel.is_set() and not self.job.cancel:
                # (A job sent to close its waiting guest has cancel set from the start: it waits.)
                self.ray.kill(actor, no_restart=True)
                return None, self._cancelled_outcome("it was cancelled while it waited for a free host")
            if not said_waiting and time.monotonic() - began > WAITING_AFTER_S:
                self.emit_status("waiting for a free host" if not affinity
                                 else f"waiting for host {self.record.host} to have a free slot")
                said_waiting = True
            if affinity and time.monotonic() - checked > 2:
                checked = time.monotonic()
                if not placement.node_alive(affinity):
                    self.ray.kill(actor, no_restart=True)
                    raise Unplaced()
        try:
            where = self.ray.get(ref)
        except placement.lost_errors() as exc:
            self.last_place_error = placement.why_lost(exc)
            raise Unplaced() from None
        problem = unusable_because(where)
        if problem:
            self.ray.kill(actor, no_restart=True)
            host = where.get("host") or where["node_id"][:12]
            if affinity:
                # The guest that waits is there, and that host cannot run its job now.
                lost = Lost(self.record.host, f"it is unusable now: {problem}")
                self._waiting_run_lost(str(lost))
                raise lost
            self.avoid[where["node_id"]] = f"host {host}: {problem}"
            self.emit_status(f"host {host} is unusable: {problem}; the job goes to another host")
            raise Unusable()
        return actor, where

    def _no_usable_host(self) -> dict:
        resources = placement.job_resources(self.os_name)
        lines = "\n".join(f"- {why}" for why in self.avoid.values())
        if not lines:
            return failed_outcome(
                f"# Job failed\n\nNo host in the Ray cluster offers {', '.join(resources)} (a "
                f"guest slot for {self.os_name!r}), so the job could never start. Start a vmd host "
                "with those resources (docs/scale-out.md) and run the job again.")
        return failed_outcome(
            f"# Job failed\n\nNo usable host offers {', '.join(resources)} (a guest slot for "
            f"{self.os_name!r}). The hosts that do cannot take a job:\n\n{lines}\n\n"
            "`vmagent hosts` lists every host and why it is unusable; fix one and run the job again.")

    def _follow(self, actor, where: dict, job: JobFile) -> dict:
        host, node_id = where["host"], where["node_id"]
        self.record.node_id, self.record.host = node_id, host
        self.record.runs.append(HostRun(host=host, node_id=node_id, started=now()))
        self.record.save(self.job_dir)
        self.emit_status(f"running on host {host}")
        if job.mode != "resume":
            self.session_id = None  # a new session comes (its frame names it); a resume keeps its own
        transcript = self._local_transcript() if job.mode != "run" else None
        lost = (placement.lost_errors())
        try:
            started = self.ray.get(actor.start.remote(job.model_dump(mode="json"), transcript,
                                                      self.worker_command, shipped_environment()), timeout=120)
        except lost as exc:
            raise self._lost(host, node_id, exc) from None
        if started.get("problem"):
            self._end_run(why="the worker did not start")
            return failed_outcome(f"# Job failed\n\nOn host {host}, {started['problem']}.")
        # A job sent with cancel set (to close its waiting guest) is cancelled by its job.json;
        # a SIGTERM could reach its worker before the worker's handler is in and kill it.
        cursor, done, cancel_sent = 0, None, job.cancel
        unavailable_since: float | None = None
        while True:
            if self.cancel.is_set() and not cancel_sent:
                actor.cancel.remote()
                cancel_sent = True
            try:
                answer = self.ray.get(actor.read.remote(cursor, READ_WAIT_S),
                                      timeout=READ_WAIT_S + READ_GRACE_S)
            except self.ray.exceptions.GetTimeoutError:
                if placement.node_alive(node_id):
                    continue
                why = "its node is no longer alive in Ray"
                self._end_run(why=f"lost: {why}")
                raise Lost(host, why) from None
            except lost as exc:
                if placement.is_unavailable(exc) and placement.node_alive(node_id):
                    # Not a verdict: the actor may answer again (a network hiccup, a restart).
                    unavailable_since = unavailable_since or time.monotonic()
                    if time.monotonic() - unavailable_since < UNAVAILABLE_GRACE_S:
                        time.sleep(1.0)
                        continue
                raise self._lost(host, node_id, exc) from None
            unavailable_since = None
            for line in answer["frames"]:
                if _is_done(line):
                    done = line  # written last, after the final transcript
                else:
                    self.session_id = _session_of(line) or self.session_id
                    self.frames.write_line(line)
            if answer.get("transcript") is not None:
                write_private(self.job_dir / "transcript.json", answer["transcript"].encode("utf-8"))
            cursor = answer["cursor"]
            if answer["ended"]:
                break
        if done is None:
            outcome = failed_outcome(
                f"# Job failed\n\nThe worker on host {host} ended without a report (exit code "
                f"{answer.get('exit_code')}).\n\nThe end of its log:\n\n```\n"
                f"{answer.get('log_tail') or ''}\n```")
        else:
            outcome = json.loads(done).get("outcome") or {}
        self._end_run(why=str(outcome.get("state") or "ended"))
        return outcome

    def _lost(self, host: str, node_id: str, exc: BaseException) -> Lost:
        """Host lost or actor died (host_loss.verdict); for the actor alone, the session it
        left on the live host is closed before the re-run."""
        lost = host_loss.verdict(host, node_id, exc, self.node_verdict_s)
        self._end_run(why=lost.record_why)
        if lost.kind == "actor" and self.session_id:
            problem = host_loss.close_left_session(node_id, host, self.session_id, self.ray_address)
            self.emit_status(f"closed the job's session on host {host}" if problem is None else
                             f"the job's session on host {host} could not be closed ({problem}); its vmd "
                             "closes it once it has had no client for its orphan_grace_s")
        return lost

    # --- records and outcomes --------------------------------------------------------

    def _end_run(self, why: str) -> None:
        if self.record.runs and not self.record.runs[-1].ended:
            self.record.runs[-1].ended, self.record.runs[-1].why = now(), why
            self.record.save(self.job_dir)

    def _local_transcript(self) -> str | None:
        try:
            return (self.job_dir / "transcript.json").read_text(encoding="utf-8")
        except OSError:
            return None

    def _cancelled_outcome(self, why: str) -> dict:
        task = self.job.spec.task
        return {**failed_outcome(f"# Job cancelled\n\nTask: {task}\n\nThe job ended here: {why}."),
                "state": "cancelled"}

    def _lost_too_often(self, losses: list[str]) -> dict:
        lines = "\n".join(f"- {loss}" for loss in losses)
        return failed_outcome(
            f"# Job failed\n\nThe job lost its host {len(losses)} times, so it is not run again "
            f"(at most {MAX_RERUNS} re-runs):\n\n{lines}\n\nWhat it did before is in the "
            "project's pushed checkpoints and in its transcript; start it again when the hosts "
            "are steady.")


def _session_of(line: str) -> str | None:
    """The session id of a worker's `session` frame (the service reads the same)."""
    if '"session"' not in line:
        return None
    try:
        frame = json.loads(line)
    except ValueError:
        return None
    if isinstance(frame, dict) and frame.get("type") == "session" and frame.get("session_id"):
        return str(frame["session_id"])
    return None


def _is_done(line: str) -> bool:
    if '"done"' not in line:
        return False
    try:
        frame = json.loads(line)
    except ValueError:
        return False
    return isinstance(frame, dict) and frame.get("type") == "done"


class LineFrameWriter(FrameWriter):
    """FrameWriter that also passes a worker's frame line on as it came."""

    def write_line(self, line: str) -> None:
        with self._lock:
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except (OSError, ValueError):
                pass


def _cancel_on_signals(cancel: threading.Event) -> None:
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    signal.signal(signal.SIGINT, lambda *_: cancel.set())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vmagent.service.ray_worker")
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS") or None)
    parser.add_argument("--worker-command", default=None,
                        help="the job's worker command on the host, a JSON list")
    parser.add_argument("--node-verdict-s", type=float, default=NODE_VERDICT_S,
                        help="how long to wait for Ray's word on the node of an actor that died")
    parser.add_argument("--allow-unauthenticated", action="store_true",
                        help="use a Ray cluster that lets a driver in without a token (the service's "
                             "ray_allow_unauthenticated)")
    args = parser.parse_args(argv)
    frames = LineFrameWriter()
    cancel = threading.Event()
    _cancel_on_signals(cancel)
    try:
        job = JobFile.read(args.job_dir)
        worker_command = json.loads(args.worker_command) if args.worker_command else None
    except (JobFileUnreadable, ValueError) as exc:
        frames.write({"type": "done", "outcome": failed_outcome(
            f"# Job failed\n\nThe job's shim could not read its job or its worker command: {exc}.")})
        return 2
    if job.cancel:
        cancel.set()
    try:
        shim = Shim(args.job_dir, job, frames, cancel, worker_command, args.ray_address,
                    allow_open=args.allow_unauthenticated, node_verdict_s=args.node_verdict_s)
        outcome = shim.run()
    except placement.RayMissing as exc:
        outcome = failed_outcome(f"# Job failed\n\n{exc}.")
    except BaseException as exc:  # every exit produces a result
        print("".join(traceback.format_exception(exc)), file=sys.stderr)
        outcome = failed_outcome(
            "# Job failed\n\nThe job's Ray shim stopped on an error: "
            f"{type(exc).__name__}: {exc}\n\nThe full traceback is in the job's worker.log.")
    _leave_ray()
    frames.write({"type": "done", "outcome": outcome})
    # Gone at once after the done frame: the service takes a job whose worker still lives
    # for a running one (an answer or a cancel waits for it), and Ray's exit hooks are done.
    os._exit(0)


def _leave_ray() -> None:
    """Disconnects from Ray before the job's end is told (a driver's exit takes seconds)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    began = time.monotonic()
    try:
        ray.shutdown()
    except Exception as exc:  # the job's end is told whatever Ray does
        print(f"leaving Ray failed: {exc}", file=sys.stderr)
    print(f"left Ray in {time.monotonic() - began:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
