"""The hosts a job service places jobs on, as a person reads them (`GET /hosts`, `vmagent hosts`).

One `HostView` per host: its guest slots (all, used, free), its vmd's open sessions and
ready warm guests, the OS families of its images, when its vmd last answered, and what
went wrong when it did not. Two listers, by the service's executor:

- local: the one vmd of the service (host "local"); its slots are the service's
  max_concurrent, and those used are vmd's sessions at work (booting or ready: a job's
  guest; one waiting for a person holds no worker).
- ray: every Ray node that is a vmd host (vmagent/fleet/host_labels.py labels, or a
  `vm_slot`); alive, slots and free slots as Ray counts them; sessions, warm guests and
  images from the node's own vmd, asked by a small task pinned to that node (its socket
  is on that machine only). All nodes are asked at once and waited for HOST_WAIT_S
  together: a node whose vmd is slow, or whose task cannot start, is listed with its
  error, and never holds the listing up. Each node's task also says the vmagent version
  installed there and the Ray auth mode its node runs with; a host is usable only when it
  is alive, labelled, its vmd answers and its version is the service's (a job's actor
  checks the same before it takes the job: vmagent/service/ray_worker.py). The listing
  says too whether the cluster turns away a driver without the token (cluster_auth.probe,
  asked at most every AUTH_CHECK_S).

vmd answers through its `host_info` verb (vmd/session/handlers/host_verbs.py), over
vmagent/link/. The command `vmagent hosts` prints `render`'s table (vmagent/cli.py).
Ray is imported only by the Ray lister.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Literal

from pydantic import BaseModel

from vmagent.fleet import cluster_auth
from vmagent.fleet.host_labels import (HOST_LABEL, SLOT_RESOURCE, VMD_SOCKET_LABEL, HostLabels, MissingHostLabels,
                                       vmagent_version)
from vmagent.fleet.on_host import pinned
from vmagent.fleet.placement import RayMissing, connect
from vmagent.link import Vmd, VmdError, VmdUnavailable
from vmd.contract.results import HostInfoResult

# How long a listing waits for the hosts' answers, all together. A node's first task starts
# a Ray worker process there (about 2 s measured on a 2-core test cluster, more with several
# nodes starting at once; a warm one answers in 0.1 s).
HOST_WAIT_S = 10.0
# How long a host's task waits for its vmd, which answers host_info from its own state in
# milliseconds: a vmd that takes longer is stuck, and says so before the listing's wait ends.
VMD_WAIT_S = 3.0
# vmd's states of a session whose guest a job works in now (a session waiting for a person
# is suspended, and its job holds no worker until the answer comes).
AT_WORK = ("booting", "ready")
# How long the cluster's auth verdict is kept: the probe is a driver process (about 2 s).
AUTH_CHECK_S = 60.0


class HostView(BaseModel):
    name: str
    node_id: str | None = None  # Ray's node id; None for the local executor's one vmd
    alive: bool  # Ray's word for a node; for the local vmd: it answered
    slots_total: int  # guests the host runs at once (Ray's vm_slot; local: max_concurrent)
    slots_used: int
    slots_free: int
    sessions: int | None = None  # open sessions in its vmd, waiting ones included; None: unknown
    warm_slots: int | None = None  # warm guests ready to hand out; None: unknown
    images: list[str] = []  # OS families its vmd has images of (linux, windows)
    last_seen: float | None = None  # when its vmd last answered (Unix time)
    error: str | None = None  # why something above is unknown
    vmagent_version: str | None = None  # installed on the host; None: unknown
    ray_auth: str | None = None  # the RAY_AUTH_MODE its Ray node runs with ("token"); None: unknown
    usable: bool = True  # whether the job service gives it jobs
    problem: str | None = None  # why not


class HostList(BaseModel):
    executor: Literal["local", "ray"]
    hosts: list[HostView]
    version: str = ""  # the job service's vmagent: every host must run the same
    # ray: "token" (a driver without the token is turned away), "open" (let in: jobs are
    # refused unless ray_allow_unauthenticated), "unknown" (the probe had no answer)
    cluster_auth: Literal["token", "open", "unknown"] | None = None
    cluster_auth_detail: str = ""


class HostsUnavailable(RuntimeError):
    """The hosts cannot be listed at all (Ray not installed, the cluster not reachable)."""


def host_info(vmd_socket: str | None, timeout: float = VMD_WAIT_S) -> HostInfoResult:
    """vmd's answer to host_info, or VmdUnavailable / VmdError."""
    with Vmd(vmd_socket, timeout=timeout) as vmd:
        return HostInfoResult.model_validate(vmd.call("host_info").model_dump())


def _families(info: HostInfoResult) -> list[str]:
    return sorted({image.os_family for image in info.images})


def local_hosts(vmd_socket: str | None, slots_total: int, timeout: float = VMD_WAIT_S) -> list[HostView]:
    """The local executor's one host: the service's vmd."""
    try:
        info = host_info(vmd_socket, timeout)
    except (VmdUnavailable, VmdError, OSError) as exc:
        return [HostView(name="local", alive=False, slots_total=slots_total, slots_used=0, slots_free=slots_total,
                         error=f"vmd did not answer host_info on {vmd_socket or 'its default socket'}: {exc}",
                         usable=False, problem="its vmd does not answer")]
    used = sum(info.states.get(state, 0) for state in AT_WORK)
    return [HostView(name="local", alive=True, slots_total=slots_total, slots_used=used,
                     slots_free=max(0, slots_total - used), sessions=info.sessions, warm_slots=info.warm_slots,
                     images=_families(info), last_seen=time.time(), vmagent_version=vmagent_version())]


def _node_host_info(vmd_socket: str, timeout: float) -> dict:
    """Runs on a host as a Ray task: the vmagent version installed there, the auth mode its
    Ray node runs with (Ray's workers inherit `ray start`'s environment), and its vmd's
    host_info as a plain dict, or why vmd did not answer. No socket label: the node's own
    (HostLabels: VMD_SOCKET of its environment, else the default)."""
    answer = {"vmagent_version": vmagent_version(),
              "ray_auth": os.environ.get(cluster_auth.MODE_ENV) or "disabled"}
    try:
        answer["info"] = host_info(vmd_socket or HostLabels.of_this_node().vmd_socket, timeout).model_dump()
    except Exception as exc:  # vmd away, refused, stuck: said in the listing
        answer["vmd_error"] = f"its vmd did not answer host_info: {_one_line(exc)}"
    return answer


class RayHosts:
    """The Ray executor's hosts. Keeps when each node's vmd last answered, for the nodes
    that stop answering or die; one listing at a time."""

    def __init__(self, address: str | None, wait_s: float = HOST_WAIT_S, vmd_wait_s: float = VMD_WAIT_S):
        self.address = address or None
        self.wait_s = wait_s
        self.vmd_wait_s = min(vmd_wait_s, wait_s)
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._task = None  # the Ray task, made once: each ray.remote() exports the function anew
        self._auth: tuple[float, str, str] | None = None  # (when, verdict, detail)

    def list(self) -> list[HostView]:
        return self.listing().hosts

    def listing(self) -> HostList:
        with self._lock:
            ray = self._connect()
            auth = threading.Thread(target=self._check_auth, daemon=True, name="ray-auth-probe")
            auth.start()  # beside the hosts' answers: a probe is a driver process of its own
            nodes = [n for n in ray.nodes() if _is_host(n)]
            free = free_slots_per_node()
            views = {n["NodeID"]: _slots_view(n, free.get(n["NodeID"])) for n in nodes}
            asked = self._ask(ray, [n for n in nodes if n.get("Alive") and views[n["NodeID"]].error is None])
            ours = vmagent_version()
            for node_id, view in views.items():
                answer = asked.get(node_id)
                if isinstance(answer, NodeAnswer):
                    view.vmagent_version, view.ray_auth = answer.vmagent_version, answer.ray_auth
                    if answer.info is not None:
                        self._seen[node_id] = time.time()
                        info = answer.info
                        view.sessions, view.warm_slots, view.images = info.sessions, info.warm_slots, _families(info)
                    else:
                        view.error = answer.vmd_error
                elif isinstance(answer, str):
                    view.error = answer
                view.last_seen = self._seen.get(node_id)
                view.problem = _problem(view, ours)
                view.usable = view.problem is None
            auth.join(cluster_auth.PROBE_WAIT_S + 5)
            when, verdict, detail = self._auth or (0.0, "unknown", "the probe did not end")
            return HostList(executor="ray", hosts=_without_replaced(list(views.values())), version=ours,
                            cluster_auth=verdict, cluster_auth_detail=detail)

    def _check_auth(self) -> None:
        """Whether the cluster turns away a driver without the token (kept AUTH_CHECK_S)."""
        if self._auth and time.monotonic() - self._auth[0] < AUTH_CHECK_S:
            return
        answer = cluster_auth.probe(self.address or os.environ.get("RAY_ADDRESS") or "auto")
        verdict = {"refused": "token", "connected": "open"}.get(answer.outcome, "unknown")
        detail = {"token": "a driver without the cluster's token is turned away",
                  "open": "a driver without a token gets in: anyone who reaches the head runs code on "
                          "every host; jobs are refused unless ray_allow_unauthenticated",
                  }.get(verdict, f"the probe had no answer in {answer.seconds:g} s: {answer.detail}")
        self._auth = (time.monotonic(), verdict, detail)

    def _connect(self):
        try:
            return connect(self.address)
        except RayMissing as exc:
            raise HostsUnavailable(str(exc)) from None
        except Exception as exc:  # Ray's ConnectionError, a timeout, a bad address
            raise HostsUnavailable(f"the Ray cluster at {self.address or 'RAY_ADDRESS'} did not answer "
                                   f"({type(exc).__name__}: {exc}); check that its head runs and that "
                                   "ray_address (RAY_ADDRESS) names it.") from None

    def _ask(self, ray, nodes: list[dict]) -> dict[str, "NodeAnswer | str"]:
        """Each node's vmd, asked at once by a task pinned to that node; waited for wait_s in all."""
        if self._task is None:
            self._task = ray.remote(num_cpus=0, max_retries=0)(_node_host_info)
        task = self._task
        refs = {}
        for node in nodes:
            socket = node["Labels"].get(VMD_SOCKET_LABEL)
            ref = task.options(scheduling_strategy=pinned(node["NodeID"])).remote(socket, self.vmd_wait_s)
            refs[ref] = node["NodeID"]
        answers: dict[str, NodeAnswer | str] = {}
        ready, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=self.wait_s) if refs else ([], [])
        for ref in ready:
            try:
                answers[refs[ref]] = NodeAnswer.of(ray.get(ref))
            except Exception as exc:  # the task's error (vmd away, refused), or Ray's (node gone)
                answers[refs[ref]] = f"its vmd did not answer host_info: {_one_line(exc)}"
        for ref in waiting:
            answers[refs[ref]] = (f"no answer to host_info within {self.wait_s:g} s: Ray did not start the "
                                  "task on this node in time (a busy or failing node); the listing went on "
                                  "without it.")
            try:
                ray.cancel(ref)
            except Exception:
                pass  # it ends by itself when vmd answers or its socket times out
        return answers


class NodeAnswer(BaseModel):
    vmagent_version: str | None = None
    ray_auth: str | None = None
    info: HostInfoResult | None = None
    vmd_error: str | None = None

    @classmethod
    def of(cls, raw: dict) -> "NodeAnswer":
        """A node's answer; a host with an older vmagent answers host_info's dict alone."""
        if "info" in raw or "vmd_error" in raw:
            return cls.model_validate(raw)
        return cls(info=HostInfoResult.model_validate(raw))


def free_slots_per_node() -> dict[str, dict]:
    """Each node's free resources, as Ray's scheduler counts them. Ray has no public call for
    this: ray.available_resources() sums the cluster, and ray.util.state asks the dashboard,
    which the fleet keeps off; Ray's own libraries (ray.util.tpu, Serve) import the same
    DeveloperAPI. tests/vmagent/fleet/test_ray_auth.py fails when Ray moves it."""
    from ray._private.state import available_resources_per_node

    return available_resources_per_node()


def _problem(view: HostView, version: str) -> str | None:
    """Why the job service gives this host no job; None: it is usable."""
    if not view.alive:
        return "Ray lost this node"
    if view.error and view.sessions is None:
        return view.error
    if view.vmagent_version != version:
        return (f"it runs vmagent {view.vmagent_version or 'of an unknown, older version'}, the job service "
                f"{version}: install the same version on the host and restart its Ray node")
    return None


def _is_host(node: dict) -> bool:
    """A vmd host: labelled as one, or offering guest slots (the head runs none)."""
    return bool((node.get("Labels") or {}).get(HOST_LABEL)) or SLOT_RESOURCE in (node.get("Resources") or {})


def _slots_view(node: dict, available: dict | None) -> HostView:
    labels = node.get("Labels") or {}
    total = int((node.get("Resources") or {}).get(SLOT_RESOURCE, 0))
    alive = bool(node.get("Alive"))
    free = int((available or {}).get(SLOT_RESOURCE, 0)) if alive else 0
    error = None
    try:
        HostLabels.from_labels(labels)
    except MissingHostLabels as exc:
        error = str(exc)
    if not alive:
        error = f"Ray lost this node: {node.get('DeathReasonMessage') or 'no reason given'}"
    return HostView(name=labels.get(HOST_LABEL) or node.get("NodeName") or node["NodeID"][:12],
                    node_id=node["NodeID"], alive=alive, slots_total=total,
                    slots_used=max(0, total - free) if alive else 0, slots_free=free, error=error)


def _without_replaced(views: list[HostView]) -> list[HostView]:
    """A dead node is left out when a live node has its host name (the host came back as a
    new node); live ones first, then by name."""
    live_names = {v.name for v in views if v.alive}
    kept = [v for v in views if v.alive or v.name not in live_names]
    return sorted(kept, key=lambda v: (not v.alive, v.name))


def _one_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError keeps the task's own error
    shown = cause if isinstance(cause, BaseException) else exc
    text = " ".join(str(shown).split())
    return f"{type(shown).__name__}: {text}"[:400]


_ray_hosts: dict[str | None, RayHosts] = {}


def list_hosts(config) -> HostList:
    """The hosts of a job service's config (vmagent/service/config.py ServiceConfig): by its
    executor, local unless it says "ray"."""
    executor = getattr(config, "executor", "local")
    if executor == "ray":
        address = getattr(config, "ray_address", "") or None
        try:
            os.environ.update(config.ray_auth_env())  # before Ray is imported here (cluster_auth.py)
        except cluster_auth.TokenProblem as exc:
            raise HostsUnavailable(str(exc)) from None
        lister = _ray_hosts.setdefault(address, RayHosts(address))
        return lister.listing()
    return HostList(executor="local", hosts=local_hosts(config.vmd_socket, config.max_concurrent),
                    version=vmagent_version())


def render(listing: HostList, now: float | None = None) -> str:
    """A table for a terminal (`vmagent hosts`), with each host's error below its row."""
    now = time.time() if now is None else now
    if not listing.hosts:
        return (f"No vmd hosts in the Ray cluster (executor {listing.executor}): start one with the "
                "`ray start ... --labels` line of docs/scale-out.md.")
    table = [("HOST", "ALIVE", "USABLE", "SLOTS (USED/ALL)", "FREE", "SESSIONS", "WARM", "IMAGES", "VERSION",
              "AUTH", "LAST SEEN", "NODE")]
    for h in listing.hosts:
        table.append((h.name, "yes" if h.alive else "no", "yes" if h.usable else "NO",
                      f"{h.slots_used}/{h.slots_total}", str(h.slots_free),
                      _or_dash(h.sessions), _or_dash(h.warm_slots), ",".join(h.images) or "-",
                      h.vmagent_version or "-", h.ray_auth or "-",
                      "-" if h.last_seen is None else f"{max(0, now - h.last_seen):.0f} s ago",
                      (h.node_id or "-")[:12]))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = []
    for row, host in zip(table, [None, *listing.hosts]):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if host is not None and host.problem:
            lines.append(f"  ! {host.name} is unusable: {host.problem}")
        if host is not None and host.error and host.error != host.problem:
            lines.append(f"  ! {host.name}: {host.error}")
    head = f"executor: {listing.executor}  vmagent {listing.version}"
    if listing.cluster_auth:
        head += f"\ncluster auth: {listing.cluster_auth} ({listing.cluster_auth_detail})"
    return head + "\n" + "\n".join(lines)


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)
