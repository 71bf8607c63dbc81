"""`vmagent ray-node head|host`: a Ray node of the fleet, started the one safe way.

    vmagent ray-node head --address 10.0.0.1 [--port 6379] [--token-file ~/.ray/auth_token]
    vmagent ray-node host --head 10.0.0.1:6379 --name rack1-a --slots 4 [--os linux,windows]
                          [--vmd-socket /run/vmd/vmd.sock] [--address 10.0.0.2] [--token-file ...]

Each ends in `ray start ... --block` (exec'd: systemd or compose supervises Ray itself),
with what docs/scale-out.md says a fleet needs:

- token authentication (vmagent/fleet/cluster_auth.py): the head makes the token at its
  first start (0600, never printed), every host must present the same file;
- the head's address is the fleet's private one, never 0.0.0.0; no dashboard (its HTTP API
  runs jobs too); no guest slots or CPUs on the head, so no job and no task of a stranger's
  job runs there;
- a host joins only once the head answers and takes its token: a head that does not
  answer within --wait-s, or refuses the token, is a sentence on this host and exit 1 or 2,
  never a `ray start` retrying for ever; its vmd is asked once (a host whose vmd does not
  answer still joins, and the job service lists it unusable with the reason).

Ray's gRPC servers (2.60) listen on every address of the machine unless the node's address
is loopback (ray/src/ray/rpc/grpc_server.cc); the private address here is what Ray
advertises and where the hosts connect. Keep the ports off other networks with the
machine's firewall, or a network namespace (a container) whose only network is the fleet's
(docs/scale-out.md has the nftables lines).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from vmagent.terminal import EXIT_NOT_DONE, EXIT_USAGE

from . import cluster_auth
from .host_labels import HOST_LABEL, OS_RESOURCES, SLOT_RESOURCE, VMD_SOCKET_LABEL

DEFAULT_PORT = 6379
# How long a host waits for its head before it says so and exits (a supervisor starts it
# again): the head's machine booting with its hosts takes this long at most in practice.
HEAD_WAIT_S = 120.0
CONNECT_TIMEOUT_S = 3.0
# vmd answers host_info from its own state in milliseconds.
VMD_WAIT_S = 3.0


class NodeProblem(RuntimeError):
    def __init__(self, sentence: str, code: int = EXIT_NOT_DONE):
        super().__init__(sentence)
        self.code = code


def ray_executable() -> str:
    """The `ray` of this Python (a venv's bin), else the first on PATH."""
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.exists() else shutil.which("ray")
    if not found:
        raise NodeProblem("Ray is not installed in this Python: pip install 'vmagent[ray]'", EXIT_USAGE)
    return found


def check_address(address: str) -> str:
    """An address Ray may advertise and the fleet reach: a single IP, not every interface."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise NodeProblem(f"--address {address!r} is not an IP address: give this machine's address on "
                          "the fleet's private network", EXIT_USAGE) from None
    if ip.is_unspecified:
        raise NodeProblem(f"--address {address} means every interface: give this machine's address on the "
                          "fleet's private network, so Ray advertises that one only", EXIT_USAGE)
    if not (ip.is_private or ip.is_loopback):
        print(f"ray-node: {address} is not a private address: Ray's ports will be reachable from wherever "
              "that address is; keep them behind a firewall (docs/scale-out.md)", file=sys.stderr)
    return address


def ray_environment(token_file: Path, address: str) -> dict[str, str]:
    """This environment with token auth from `token_file` (RAY_AUTH_TOKEN, which would win
    over the file, removed)."""
    env = {k: v for k, v in os.environ.items() if k != cluster_auth.TOKEN_ENV}
    env[cluster_auth.MODE_ENV] = "token"
    env[cluster_auth.TOKEN_PATH_ENV] = str(token_file)
    if address.startswith("127."):
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # a loopback head stays there (placement.keep_loopback)
    return env


def head_command(args) -> tuple[list[str], dict[str, str]]:
    address = check_address(args.address)
    token = Path(args.token_file).expanduser()
    try:
        made = cluster_auth.make_token(token)
    except cluster_auth.TokenProblem as exc:
        raise NodeProblem(str(exc), EXIT_USAGE) from None
    except OSError as exc:
        raise NodeProblem(f"the Ray token could not be made at {token}: {exc}", EXIT_USAGE) from None
    print(f"ray-node: {'made a new' if made else 'using the'} Ray token at {token} (0600); copy it to each "
          "host's --token-file", file=sys.stderr)
    command = [ray_executable(), "start", "--head", "--block", f"--node-ip-address={address}",
               f"--port={args.port}", "--num-cpus=0", "--num-gpus=0", "--resources={}",
               "--include-dashboard=false", "--disable-usage-stats"]
    if args.object_store_mb:
        command.append(f"--object-store-memory={args.object_store_mb * 1024 * 1024}")
    return command, ray_environment(token, address)


def wait_for_head(host: str, port: int, wait_s: float) -> None:
    """Until the head's port takes a connection; a sentence when it does not within wait_s."""
    deadline = time.monotonic() + wait_s
    last = ""
    while True:
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
            return
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
        if time.monotonic() >= deadline:
            raise NodeProblem(
                f"the Ray head at {host}:{port} did not answer within {wait_s:g} s ({last}): check that it runs "
                "(`vmagent ray-node head`), that this host reaches it at that address, and that no firewall "
                f"drops port {port} between them")
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))


def vmd_problem(vmd_socket: str) -> str | None:
    from .hosts import host_info

    try:
        host_info(vmd_socket, VMD_WAIT_S)
    except Exception as exc:  # VmdUnavailable, VmdError, OSError: said, not raised
        return f"{type(exc).__name__}: {exc}"
    return None


def host_command(args) -> tuple[list[str], dict[str, str]]:
    head_host, _, head_port = args.head.rpartition(":")
    if not head_host or not head_port.isdigit():
        raise NodeProblem(f"--head {args.head!r} is not HOST:PORT (the head's address, e.g. 10.0.0.1:6379)",
                          EXIT_USAGE)
    families = [f.strip() for f in args.os.split(",") if f.strip()]
    unknown = [f for f in families if f not in OS_RESOURCES]
    if not families or unknown:
        raise NodeProblem(f"--os {args.os!r}: give OS families among {', '.join(OS_RESOURCES)}", EXIT_USAGE)
    if args.slots < 1:
        raise NodeProblem("--slots must be at least 1 (the guests this host runs at once)", EXIT_USAGE)
    token = Path(args.token_file).expanduser()
    try:
        cluster_auth.check_token_file(token)
    except cluster_auth.TokenProblem as exc:
        raise NodeProblem(str(exc), EXIT_USAGE) from None
    wait_for_head(head_host, int(head_port), args.wait_s)
    env = ray_environment(token, head_host)
    answer = cluster_auth.probe(args.head, {k: env[k] for k in (cluster_auth.MODE_ENV, cluster_auth.TOKEN_PATH_ENV)},
                                wait_s=args.wait_s)
    if answer.outcome == "refused":
        raise NodeProblem(f"the Ray head at {args.head} refused this host's token ({token}): copy the head's "
                          "token file here (mode 0600) and start the host again", EXIT_USAGE)
    if answer.outcome == "silent":
        raise NodeProblem(f"the Ray head at {args.head} took the connection but did not answer as Ray within "
                          f"{args.wait_s:g} s: is it a Ray head of the same version? ({answer.detail})")
    problem = vmd_problem(args.vmd_socket)
    if problem:
        print(f"ray-node: this host's vmd does not answer at {args.vmd_socket} ({problem}): the host joins, "
              "but the job service lists it unusable and gives it no jobs until vmd answers", file=sys.stderr)
    resources = {SLOT_RESOURCE: args.slots, **{OS_RESOURCES[f]: args.slots for f in families}}
    labels = {HOST_LABEL: args.name, VMD_SOCKET_LABEL: args.vmd_socket}
    command = [ray_executable(), "start", f"--address={args.head}", "--block",
               f"--num-cpus={args.num_cpus}", "--num-gpus=0", f"--resources={json.dumps(resources)}",
               # JSON: Ray refuses a path as a label value in its key=value form (host_labels.py).
               f"--labels={json.dumps(labels)}", "--disable-usage-stats"]
    if args.address:
        command.append(f"--node-ip-address={check_address(args.address)}")
    if args.object_store_mb:
        command.append(f"--object-store-memory={args.object_store_mb * 1024 * 1024}")
    env["VMD_SOCKET"] = args.vmd_socket
    return command, env


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vmagent ray-node", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="role", required=True)
    head = sub.add_parser("head", help="the Ray head: the job service's machine, no guest slots")
    head.add_argument("--address", required=True, help="this machine's address on the fleet's private network")
    head.add_argument("--port", type=int, default=DEFAULT_PORT)
    host = sub.add_parser("host", help="a KVM host: its vmd's guests offered to the cluster")
    host.add_argument("--head", required=True, help="the head's HOST:PORT as this host reaches it")
    host.add_argument("--name", required=True, help="this host's name in listings and job reports (unique)")
    host.add_argument("--slots", type=int, required=True, help="guests this host runs at once")
    host.add_argument("--os", default="linux", help="OS families of this host's images (linux,windows)")
    host.add_argument("--vmd-socket", default=os.environ.get("VMD_SOCKET") or "/run/vmd/vmd.sock")
    host.add_argument("--address", default="", help="this host's private address (default: the one "
                                                    "that reaches the head)")
    host.add_argument("--num-cpus", type=int, default=os.cpu_count() or 1)
    host.add_argument("--wait-s", type=float, default=HEAD_WAIT_S, help="how long to wait for the head")
    for each in (head, host):
        each.add_argument("--token-file", default=os.environ.get(cluster_auth.TOKEN_PATH_ENV)
                          or str(cluster_auth.DEFAULT_TOKEN_PATH))
        each.add_argument("--object-store-mb", type=int, default=0,
                          help="Ray's object store (default: Ray's own share of memory)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        command, env = head_command(args) if args.role == "head" else host_command(args)
    except NodeProblem as exc:
        print(f"vmagent ray-node {args.role}: {exc}", file=sys.stderr)
        return exc.code
    print(f"ray-node: {' '.join(command)}", file=sys.stderr)  # names the token's path, never the token
    sys.stderr.flush()
    os.execvpe(command[0], command, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
