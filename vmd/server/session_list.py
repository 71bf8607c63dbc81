"""`vmd sessions`: every session of a state dir, read from its session.json, with what
libvirt says of its guest. It needs no running vmd: the client counts are those vmd last
saved (it saves them as connections come and go), and the listing says whether a vmd
answers on the socket, so a reader knows whether they are current."""

from __future__ import annotations

import socket
import time

from pydantic import BaseModel

from vmd.config import VmdConfig
from vmd.session.state import SessionState


class SessionRow(BaseModel):
    id: str
    state: str  # the session's state, or "unreadable"
    age_s: float | None = None
    clients: int | None = None
    detached_s: float | None = None  # since the last client went, while none is bound
    machine_name: str = ""
    machine: str = "unknown"  # running | paused | shut off | none (no domain) | unknown
    push: str | None = None  # pending | pushed | failed, for a closed session with a project
    project: str | None = None
    task: str = ""
    note: str = ""  # why vmd closed it, or what could not be read


def _domain_states(config: VmdConfig, names: list[str]) -> dict[str, str]:
    """libvirt's word for each guest; empty when libvirt cannot be asked."""
    try:
        import libvirt
    except ImportError:
        return {}
    # A guest that is gone is an answer here ("none"), not an error for libvirt to print.
    libvirt.registerErrorHandler(lambda *_: None, None)
    try:
        conn = libvirt.openReadOnly(config.libvirt_uri)
    except libvirt.libvirtError:
        return {}
    words = {libvirt.VIR_DOMAIN_RUNNING: "running", libvirt.VIR_DOMAIN_PAUSED: "paused",
             libvirt.VIR_DOMAIN_SHUTOFF: "shut off"}
    states = {}
    try:
        for name in names:
            try:
                states[name] = words.get(conn.lookupByName(name).state()[0], "other")
            except libvirt.libvirtError:
                states[name] = "none"
    finally:
        conn.close()
    return states


def list_sessions(config: VmdConfig, libvirt: bool = True, now: float | None = None) -> list[SessionRow]:
    now = time.time() if now is None else now
    rows = []
    folder = config.sessions_dir
    for path in sorted(folder.glob("s-*")) if folder.is_dir() else []:
        if not path.is_dir():
            continue
        try:
            s = SessionState.model_validate_json((path / "session.json").read_text())
        except (OSError, ValueError) as exc:
            rows.append(SessionRow(id=path.name, state="unreadable", machine_name=f"vmagent-{path.name}",
                                   note=f"session.json could not be read: {type(exc).__name__}"))
            continue
        closed = s.state == "closed"
        rows.append(SessionRow(
            id=s.id, state=s.state, age_s=round(now - s.created, 1),
            clients=None if closed else s.clients,
            detached_s=None if closed or s.clients or s.detached_at is None else round(now - s.detached_at, 1),
            machine_name=s.machine_name, push=s.push.state if s.push else None, project=s.project,
            task=(s.task.strip().splitlines() or [""])[0][:60],
            note=(s.close or {}).get("reason") or ""))
    if libvirt and rows:
        states = _domain_states(config, [r.machine_name for r in rows])
        for row in rows:
            row.machine = states.get(row.machine_name, "unknown")
    return rows


def vmd_answers(config: VmdConfig) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(str(config.socket))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def render(rows: list[SessionRow], config: VmdConfig) -> str:
    running = vmd_answers(config)
    head = (f"vmd answers on {config.socket}: client counts are current." if running else
            f"no vmd answers on {config.socket}: client counts are as vmd last saved them.")
    if not rows:
        return f"{head}\nNo sessions in {config.sessions_dir}."
    table = [("SESSION", "STATE", "AGE", "CLIENTS", "MACHINE", "PUSH", "TASK")]
    for r in rows:
        clients = "-" if r.clients is None else str(r.clients)
        if r.detached_s is not None:
            clients += f" (none for {_age(r.detached_s)})"
        table.append((r.id, r.state, _age(r.age_s), clients, f"{r.machine_name} ({r.machine})",
                      r.push or "-", r.task + (f" — {r.note}" if r.note else "")))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1]
             for row in table]
    return head + "\n" + "\n".join(line.rstrip() for line in lines)
