"""`vmd doctor`: what this setup is missing, in sentences.

Each check is a function that looks at one thing and answers a `Finding`: its status and a
sentence saying what is there, or what is missing and what to do about it. The checks:

- `libvirtd`: libvirtd answers at vmd's libvirt URI.
- `accel`: QEMU is installed, and guests get KVM (or run under TCG, 4x slower).
- `image`: the default guest image is built, is being built (how far), or is missing.
- `egress`: the egress guard (vmd/machines/egress_guard.py) is in force for QEMU's user, and a
  process running as that user is refused the host's loopback when it tries.
- `socket`: vmd listens on its socket, and the job service's group may connect to it.
- `gitea`: Gitea answers with the token, and the token has the scopes vmd uses.
- `ollama`: the model server answers (Ollama, or an OpenAI-compatible one where
  VMAGENT_MODEL_API=openai), has the model, and it can call tools and see (or vmd can read
  the screen for it with OCR): vmd/server/model_check.py.
- `windows`: Windows guests can run here (KVM, OVMF, swtpm) and an image is built, or what is
  missing (vmd/images/windows/readiness.py); a warning at worst, since Windows is optional.

A status is `ok`, `warn` (works, but worse than it could: TCG, no eyes for the model),
`wait` (not yet: an image being built) or `fail`. The exit code is 0 when nothing waits
or fails, so that a container's health check can be `python -m vmd.server.doctor --check ...`:
the compose file's health checks are, and wait for the first image build that way.

    vmd doctor [--check NAME ...] [--json]
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import pwd
import re
import shutil
import socket
import stat
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from pydantic import SecretStr

from vmd.config import VmdConfig
from vmd.images.windows.readiness import windows_readiness
from vmd.machines.accel import choose_accel, kvm_works
from vmd.machines.egress_guard import EgressGuard
from vmd.machines.images import ImageMissing, recipe_hash
from vmd.server.findings import HTTP_TIMEOUT_S, Finding, Status, one_line as _one_line  # noqa: F401 (Status: the doctor's API)
from vmd.server.model_check import OPENAI_DEFAULT_URL, check_ollama, check_openai_model

CHECKS = ("libvirtd", "accel", "egress", "image", "socket", "gitea", "ollama", "windows")
# A repository name nobody has: the write probe on it answers 404 with the scope and 403
# without, and changes nothing either way.
PROBE_REPO = "vmd-doctor-scope-probe-absent"
ZERO_SHA = "0" * 40


# --- libvirt and QEMU ---------------------------------------------------------------------

def check_egress(guard: EgressGuard) -> Finding:
    problem = guard.problem()
    if problem is None:
        problem = guard.probe() if os.geteuid() == 0 else None
        if problem is None:
            return Finding("egress", "ok", f"the egress guard is in force: guests that get egress reach the "
                                           f"internet only, not this host or its networks ({len(guard.allowed)} "
                                           f"allow-listed range(s))")
        return Finding("egress", "fail", f"the egress guard is installed but does not hold: {problem}; check "
                                         f"the host's other nftables/iptables rules")
    return Finding("egress", "fail", f"{problem}. Until then vmd refuses to open a guest's network egress "
                                     f"(a person's approval is answered with this sentence)")


def check_libvirtd(uri: str) -> Finding:
    try:
        import libvirt
    except ImportError:
        return Finding("libvirtd", "fail", "libvirt-python is not installed in vmd's environment: "
                                           "install the package with its dependencies (`pip install -e .`).")
    libvirt.registerErrorHandler(lambda *_: None, None)  # the error is in the exception
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        return Finding("libvirtd", "fail",
                       f"libvirtd does not answer at {uri} ({_one_line(str(exc))}): start it "
                       "(`systemctl start libvirtd`, or `virtlogd -d && libvirtd -d` where no "
                       "systemd runs; scripts/setup.sh and the vmd container do) or set VMD_LIBVIRT_URI.")
    try:
        version = conn.getLibVersion()
        running = len(conn.listAllDomains())
    finally:
        conn.close()
    return Finding("libvirtd", "ok", f"libvirtd {version // 1000000}.{version // 1000 % 1000}."
                                     f"{version % 1000} answers at {uri} ({running} domains defined).")


def check_accel(kvm_probe: Callable[[], bool], setting: str = "auto") -> Finding:
    """The accelerator guests get under `setting` (VmdConfig.accel, VMD_ACCEL), asking
    `kvm_probe` (QEMU itself: accel.kvm_works with the config's images_dir) when the setting
    forces none."""
    if not shutil.which("qemu-system-x86_64"):
        return Finding("accel", "fail", "qemu-system-x86_64 is not installed: "
                                        "`apt-get install qemu-system-x86 qemu-utils`.")
    if choose_accel(setting, kvm_probe) == "kvm":
        return Finding("accel", "ok", "guests run with KVM" + (" (VMD_ACCEL=kvm)." if setting == "kvm" else "."))
    if setting in ("qemu", "tcg"):
        return Finding("accel", "warn", f"guests run under TCG because VMD_ACCEL={setting} (about 4x "
                                        "slower than KVM; a boot takes 30-40 s): unset it to use KVM.")
    if not os.path.exists("/dev/kvm"):
        why = "there is no /dev/kvm (no KVM on this host, or the container was not given it)"
    elif not os.access("/dev/kvm", os.R_OK | os.W_OK):
        why = "/dev/kvm is not readable and writable by vmd's user"
    else:
        why = "/dev/kvm is there but QEMU cannot start a KVM guest with it"
    return Finding("accel", "warn", f"guests run under TCG, about 4x slower than KVM (a boot takes "
                                    f"30-40 s), because {why}; vmd's timeouts allow for it.")


# --- the guest image -----------------------------------------------------------------------

_STEP = re.compile(r"^STEP (\d+)/(\d+) (.*)$", re.M)


def _build_running(partial: Path, proc_root: Path = Path("/proc")) -> bool:
    """Whether a recipe's build.sh is writing `partial` now (vmd.images.build.build runs it with
    the partial folder as its argument); only processes this one can see count."""
    needle = str(partial).encode()
    for cmdline in proc_root.glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in args and any(a.endswith(b"build.sh") for a in args):
            return True
    return False


def check_image(images_dir: Path, name: str = "debian", proc_root: Path = Path("/proc")) -> Finding:
    try:
        current = images_dir / f"{name}-{recipe_hash(name)}"
    except ImageMissing as exc:
        return Finding("image", "fail", str(exc))
    if (current / "manifest.json").is_file():
        return Finding("image", "ok", f"the {name} guest image is built ({current}).")
    log = images_dir / f"{current.name}.log"
    partial = current.with_name(current.name + ".partial")
    if _build_running(partial, proc_root):
        steps = _STEP.findall(log.read_text(errors="replace")) if log.is_file() else []
        where = f"step {steps[-1][0]}/{steps[-1][1]}: {steps[-1][2]}" if steps else "starting"
        return Finding("image", "wait", f"the {name} guest image is being built ({where}; 5-15 min in "
                                        f"all, longer without KVM; log {log}).")
    older = sorted(images_dir.glob(f"{name}-*/manifest.json")) if images_dir.is_dir() else []
    if older:
        return Finding("image", "warn", f"only an older {name} image is built ({older[-1].parent.name}); "
                                        f"guests use it until `vmd images build {name}` builds the current recipe.")
    if log.is_file():
        tail = " ".join(log.read_text(errors="replace").splitlines()[-3:])
        return Finding("image", "fail", f"the {name} guest image is not built; the last build stopped "
                                        f"({_one_line(tail)[:300]}; log {log}): run `vmd images build {name}` "
                                        "(it needs root, debootstrap and a Debian mirror: VMD_APT_MIRROR).")
    return Finding("image", "fail", f"the {name} guest image is not built in {images_dir}: run "
                                    f"`vmd images build {name}` (the vmd container builds it on its first start).")


# --- the socket ----------------------------------------------------------------------------

def _group_id(group: str | int) -> int:
    text = str(group).strip()
    return int(text) if text.isdigit() else grp.getgrnam(text).gr_gid


def _allows(st: os.stat_result, uid: int | None, gids: set[int], bits: int) -> bool:
    """Whether a process of `uid` (None: not the owner) with `gids` gets `bits` (r=4, w=2,
    x=1) on a file of this stat, as the kernel decides it for a non-root caller."""
    if uid is not None and st.st_uid == uid:
        return st.st_mode >> 6 & bits == bits
    if st.st_gid in gids:
        return st.st_mode >> 3 & bits == bits
    return st.st_mode & bits == bits


def _describe(st: os.stat_result) -> str:
    def name(lookup, key, attr):
        try:
            return getattr(lookup(key), attr)
        except KeyError:
            return str(key)
    return f"{name(pwd.getpwuid, st.st_uid, 'pw_name')}:{name(grp.getgrgid, st.st_gid, 'gr_name')} " \
           f"{stat.S_IMODE(st.st_mode):04o}"


def check_socket(path: Path, client_group: str | int | None = None) -> Finding:
    """vmd listens on `path`; with `client_group`, a process of that group (not root, not
    the socket's owner: the job service) may also reach and connect to it."""
    path = Path(path)
    if not path.exists():
        return Finding("socket", "fail", f"vmd's socket {path} does not exist: vmd is not serving "
                                         "(`vmd serve`), or it serves elsewhere (VMD_SOCKET must be the same "
                                         "for vmd and the job service).")
    st = path.stat()
    if not stat.S_ISSOCK(st.st_mode):
        return Finding("socket", "fail", f"{path} is not a socket: remove it and start `vmd serve`.")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(5)
    try:
        probe.connect(str(path))
    except PermissionError:
        return Finding("socket", "fail", f"this user (uid {os.getuid()}) may not connect to vmd's socket "
                                         f"{path} ({_describe(st)}): run as vmd's user or a member of the "
                                         "socket's group, or give the socket's folder the job service's group "
                                         "(VMD_SOCKET_GROUP in the vmd container).")
    except OSError as exc:
        return Finding("socket", "fail", f"nothing answers on vmd's socket {path} ({exc.strerror or exc}): "
                                         "a vmd that died left it; start `vmd serve` again.")
    finally:
        probe.close()
    if client_group in (None, ""):
        return Finding("socket", "ok", f"vmd answers on {path} ({_describe(st)}).")
    try:
        gid = _group_id(client_group)
    except KeyError:
        return Finding("socket", "fail", f"the job service's group {client_group!r} (VMD_SOCKET_GROUP) "
                                         "does not exist here: give its number instead.")
    for folder in [p for p in path.parents if p != Path("/")][::-1]:
        if not _allows(folder.stat(), None, {gid}, 1):
            return Finding("socket", "fail", f"vmd answers on {path}, but the job service's group "
                                             f"(gid {gid}) may not enter {folder} ({_describe(folder.stat())}), "
                                             f"so every job would fail with 'permission denied': "
                                             f"`chgrp {gid} {folder} && chmod g+x {folder}`.")
    if not _allows(st, None, {gid}, 2):
        return Finding("socket", "fail", f"vmd answers on {path}, but the socket is {_describe(st)}, so "
                                         f"the job service (gid {gid}) gets 'permission denied' on every "
                                         f"job: make its folder the service's group with the setgid bit "
                                         f"(`chgrp {gid} {path.parent} && chmod 2750 {path.parent}`, as the vmd "
                                         "container does with VMD_SOCKET_GROUP) and restart vmd.")
    return Finding("socket", "ok", f"vmd answers on {path} ({_describe(st)}), and the job service's "
                                   f"group (gid {gid}) may connect.")


# --- Gitea ---------------------------------------------------------------------------------

def _gitea_refusal(response) -> str:
    try:
        return str(response.json().get("message") or response.text)[:300]
    except ValueError:
        return response.text[:300]


def check_gitea(config: VmdConfig, timeout: float = HTTP_TIMEOUT_S) -> Finding:
    """Gitea answers with vmd's token, and the token has each scope vmd's pushes use:
    read:user (who it is), write:repository (create and push), write:organization (the
    service's organisation, in org mode), write:admin (only to create people's accounts).
    Each write scope is probed with a request Gitea refuses for the scope (403) before it
    looks at anything, and otherwise answers 404 or 422: nothing is created."""
    import httpx

    url = config.gitea_url.rstrip("/")
    token = config.gitea_token.get_secret_value()
    if not url:
        return Finding("gitea", "warn", "GITEA_URL is not set: projects stay in vmd's own repositories "
                                        "(under VMD_STATE_DIR/repos) and are pushed nowhere.")
    if not token:
        return Finding("gitea", "fail", f"GITEA_URL is {url} but GITEA_TOKEN is empty: make a token "
                                        "(Gitea: Settings -> Applications, scopes write:repository, "
                                        "write:organization, read:user) and set GITEA_TOKEN.")
    headers = {"Authorization": f"token {token}"}
    try:
        with httpx.Client(base_url=url + "/api/v1", headers=headers, timeout=timeout,
                          follow_redirects=False) as api:
            me = api.get("/user")
            if me.status_code == 401:
                return Finding("gitea", "fail", f"Gitea at {url} refuses the token (401: "
                                                f"{_gitea_refusal(me)}): GITEA_TOKEN is wrong or revoked; make a new one.")
            if me.status_code == 403:
                return Finding("gitea", "fail", f"Gitea at {url} refuses to say whose the token is "
                                                f"({_gitea_refusal(me)}): the token needs the read:user scope.")
            if me.status_code != 200:
                return Finding("gitea", "fail", f"Gitea at {url} answered GET /api/v1/user with "
                                                f"{me.status_code}: is GITEA_URL Gitea's address?")
            login = me.json().get("login", "?")
            probes = [("write:repository", "POST", f"/repos/{login}/{PROBE_REPO}/statuses/{ZERO_SHA}", {})]
            if config.gitea_owner_mode == "org":
                probes.append(("write:organization", "POST", "/orgs", {}))
            if config.gitea_create_users:
                probes.append(("write:admin", "POST", "/admin/users", {}))
            missing = [scope for scope, method, path, body in probes
                       if _lacks_scope(api.request(method, path, json=body))]
    except httpx.HTTPError as exc:
        return Finding("gitea", "fail", f"Gitea does not answer at {url} ({_one_line(str(exc)) or type(exc).__name__}): "
                                        "start it, or set GITEA_URL to where vmd reaches it.")
    if missing:
        return Finding("gitea", "fail", f"Gitea at {url} knows the token (user {login}) but it lacks "
                                        f"{', '.join(missing)}: make a token with those scopes and set GITEA_TOKEN.")
    return Finding("gitea", "ok", f"Gitea answers at {url}; the token is {login}'s and has the scopes vmd uses.")


def _lacks_scope(response) -> bool:
    return response.status_code == 403 and "scope" in _gitea_refusal(response).lower()


# --- running them ------------------------------------------------------------------------



def run_checks(names: list[str] | tuple[str, ...] = CHECKS, config: VmdConfig | None = None) -> list[Finding]:
    config = config or VmdConfig.load()
    token_file = config.gitea_token_file
    if not config.gitea_token.get_secret_value() and token_file and token_file.is_file():
        # Where the compose setup keeps it (its entrypoint reads it into GITEA_TOKEN for vmd).
        config = config.model_copy(update={"gitea_token": SecretStr(token_file.read_text().strip())})
    table: dict[str, Callable[[], Finding]] = {
        "libvirtd": lambda: check_libvirtd(config.libvirt_uri),
        "accel": lambda: check_accel(lambda: kvm_works(config.images_dir), setting=config.accel),
        "egress": lambda: check_egress(EgressGuard.from_config(config)),
        "image": lambda: check_image(config.images_dir, config.default_os),
        "socket": lambda: check_socket(config.socket, config.socket_group or None),
        "gitea": lambda: check_gitea(config),
        # The model server the agent is set to use: Ollama's protocol, or an OpenAI-compatible one.
        "ollama": lambda: (check_openai_model(config.model_url or OPENAI_DEFAULT_URL, config.ollama_model,
                                              config.model_key.get_secret_value(), config.model_vision)
                           if config.model_api == "openai" else check_ollama(config.ollama_host, config.ollama_model)),
        "windows": lambda: Finding("windows", *windows_readiness(config.images_dir)),
    }
    findings = []
    for name in names:
        try:
            findings.append(table[name]())
        except Exception as exc:  # a check that breaks says so; the others still run
            findings.append(Finding(name, "fail", f"the check itself failed: {type(exc).__name__}: {exc}"))
    return findings


def ready(findings: list[Finding]) -> bool:
    return all(f.status in ("ok", "warn") for f in findings)


def add_parser(sub) -> argparse.ArgumentParser:
    """`vmd doctor` on the subcommands of vmd's command line."""
    doctor = sub.add_parser("doctor", help="say what this setup is missing (libvirtd, KVM, egress guard, image, socket, Gitea, Ollama)")
    doctor.add_argument("--check", action="append", choices=CHECKS, metavar="NAME",
                        help=f"run only these checks (repeatable): {', '.join(CHECKS)}; default all")
    doctor.add_argument("--config", help="a TOML file of VmdConfig fields (env VMD_CONFIG)")
    doctor.add_argument("--json", action="store_true", help="one JSON object per finding")
    doctor.set_defaults(func=cli)
    return doctor


def cli(args) -> int:
    try:
        config = VmdConfig.load(args.config)
    except (FileNotFoundError, ValueError) as exc:
        print(f"vmd doctor: {exc}", file=sys.stderr)
        return 2
    findings = run_checks(args.check or CHECKS, config)
    if args.json:
        print(json.dumps([asdict(f) for f in findings], indent=1))
    else:
        print("\n".join(f.line() for f in findings))
    return 0 if ready(findings) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vmd")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return cli(parser.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
