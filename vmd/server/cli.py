"""`vmd serve`, `vmd sessions` and `vmd images …`."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from vmd.config import VmdConfig
from vmd.images.build import cli_build, cli_list
from vmd.images.windows.build import cli_build_windows
from vmd.machines.egress_guard import EgressGuard, EgressGuardError
from vmd.server import doctor
from vmd.server.session_list import list_sessions, render


def _serve(args) -> int:
    # Here, not above: `vmd doctor`, `vmd sessions`, `vmd guard` and `vmd images` start
    # without the server's libvirt and paramiko.
    from vmd.server.rpc import VmdServer

    try:
        config = VmdConfig.load(args.config, socket=args.socket, state_dir=args.state_dir,
                                images_dir=args.images_dir)
    except (FileNotFoundError, ValueError) as exc:
        print(f"vmd serve: {exc}", file=sys.stderr)
        return 2
    # vmd sets its own files' modes (vmd/private_fs.py); this covers what its children
    # write beside them (git's FETCH_HEAD, qemu-img's files) before vmd gets to them.
    os.umask(0o077)
    server = VmdServer(config)
    try:
        server.bind()
    except (RuntimeError, OSError) as exc:
        print(f"vmd serve: cannot listen on {config.socket}: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: server._stopping.set())
    print(f"vmd: serving on {config.socket} (state in {config.state_dir})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def _sessions(args) -> int:
    try:
        config = VmdConfig.load(args.config, socket=args.socket, state_dir=args.state_dir)
    except (FileNotFoundError, ValueError) as exc:
        print(f"vmd sessions: {exc}", file=sys.stderr)
        return 2
    rows = list_sessions(config, libvirt=not args.no_libvirt)
    if args.json:
        import json
        print(json.dumps([r.model_dump() for r in rows], indent=1))
    else:
        print(render(rows, config))
    return 0


def _guard(args) -> int:
    try:
        guard = EgressGuard.from_config(VmdConfig.load(args.config))
        if args.guard_command == "install":
            print(f"vmd guard: installed (nftables table inet vmagent_egress, rules {guard.install()})")
            return 0
        if args.guard_command == "show":
            print(guard.ruleset().render(), end="")
            return 0
    except (FileNotFoundError, ValueError, EgressGuardError) as exc:
        print(f"vmd guard: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, EgressGuardError) else 2
    problem = guard.problem() or guard.probe()
    print(f"vmd guard: {problem}" if problem else "vmd guard: in force, and it holds")
    return 1 if problem else 0


WINDOWS_OPTIONS = ("iso", "edition", "key", "virtio_win", "openssh_msi", "language", "resolution")


def _images(args) -> int:
    if args.images_command != "build":
        return cli_list(args)
    if args.name == "windows":
        return cli_build_windows(args)
    given = [f"--{o.replace('_', '-')}" for o in WINDOWS_OPTIONS if getattr(args, o)]
    if given:
        print(f"vmd images build: {', '.join(given)} belong to `vmd images build windows`", file=sys.stderr)
        return 2
    return cli_build(args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vmd", description="The vmagent supervisor: guests, sessions, records.")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the verb table on a Unix socket")
    serve.add_argument("--socket", help="socket path (env VMD_SOCKET; default /run/vmd/vmd.sock)")
    serve.add_argument("--state-dir", help="sessions, records, projects (env VMD_STATE_DIR)")
    serve.add_argument("--images-dir", help="built guest images (env VMD_IMAGES_DIR)")
    serve.add_argument("--config", help="a TOML file of VmdConfig fields (env VMD_CONFIG)")
    serve.set_defaults(func=_serve)

    sessions = sub.add_parser("sessions", help="list the sessions of a state dir: state, age, clients, machine")
    sessions.add_argument("--state-dir", help="sessions, records, projects (env VMD_STATE_DIR)")
    sessions.add_argument("--socket", help="the socket of the vmd serving that state dir (env VMD_SOCKET)")
    sessions.add_argument("--config", help="a TOML file of VmdConfig fields (env VMD_CONFIG)")
    sessions.add_argument("--json", action="store_true", help="one JSON object per session")
    sessions.add_argument("--no-libvirt", action="store_true", help="do not ask libvirt about the guests")
    sessions.set_defaults(func=_sessions)

    images = sub.add_parser("images", help="build and list guest images")
    images_sub = images.add_subparsers(dest="images_command", required=True)
    build = images_sub.add_parser("build", help="build an image from its recipe under images/")
    build.add_argument("name")
    build.add_argument("--images-dir", help="where images live (env VMD_IMAGES_DIR)")
    # windows: from the user's own media (docs/windows.md); vmd never downloads any.
    build.add_argument("--iso", help="windows: your Windows x64 install ISO")
    build.add_argument("--edition", help="windows: the edition's name or index (default: Pro / Standard)")
    build.add_argument("--key", help="windows: your product key, XXXXX-XXXXX-XXXXX-XXXXX-XXXXX")
    build.add_argument("--virtio-win", help="windows: a virtio-win ISO (virtio disk and network drivers)")
    build.add_argument("--openssh-msi", help="windows: OpenSSH-Win64.msi, for editions without built-in OpenSSH")
    build.add_argument("--language", help="windows: language tag such as en-US (default: the edition's)")
    build.add_argument("--resolution", help="windows: WIDTHxHEIGHT of the desktop (default 1280x800)")
    listing = images_sub.add_parser("list", help="list built images")
    listing.add_argument("--images-dir", help="where images live (env VMD_IMAGES_DIR)")
    images.set_defaults(func=_images)
    guard = sub.add_parser("guard", help="the egress guard: guests with egress reach the internet, not this host")
    guard.add_argument("guard_command", choices=("install", "check", "show"))
    guard.add_argument("--config", help="a TOML file of VmdConfig fields (env VMD_CONFIG)")
    guard.set_defaults(func=_guard)
    doctor.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
