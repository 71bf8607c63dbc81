"""The cloud-init NoCloud seed that turns Ubuntu's cloud image into the vmagent guest.

    python vmd/images/ubuntu/seed.py OUTDIR --pubkey id_ed25519.pub --resolution 1280x800

writes OUTDIR/user-data, OUTDIR/meta-data and OUTDIR/network-config. On its first boot the
guest creates the user `agent` (uid 1000, passwordless sudo, the given login key), installs
sshd, git, a compiler and the same desktop as vmd/images/debian (Xorg started by a systemd unit,
openbox, a focused xterm titled "terminal" at a pinned resolution), mounts the host's 9p
share `project` at /mnt/project, and powers off, which is how build.sh knows it finished.
Before that it hands build.sh the kernel, initrd and a verdict on the disk whose serial is
`export_serial` (see EXPORT_SCRIPT); booted without that disk, the seed skips the hand-over.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import re
import struct
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError, field_validator

USER = "agent"
PROJECT_PATH = "/mnt/project"

# What the brief of the Debian image asks for, as Ubuntu names it; apt installs recommends,
# the last line names what the desktop needs even if recommends change.
PACKAGES = [
    "openssh-server", "qemu-guest-agent", "git", "python3", "python3-venv", "build-essential",
    "xserver-xorg-core", "xserver-xorg-legacy", "xinit", "openbox", "xterm",
    "x11-xserver-utils", "x11-utils", "python3-tk",
    "xserver-xorg-input-libinput", "xauth", "xfonts-base", "xdotool",
]

_KEY_TYPES = (
    "ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
)


class SeedError(ValueError):
    """Inputs that cannot make a seed; the message says which and what to pass instead."""


class Seed(BaseModel):
    pubkey: str
    resolution: tuple[int, int] = (1280, 800)
    hostname: str = "vmagent-guest"
    instance_id: str = "vmagent-ubuntu-1"
    export_serial: str = "vmd-boot"

    @field_validator("pubkey")
    @classmethod
    def _openssh_public_key(cls, value: str) -> str:
        value = value.strip()
        parts = value.split()
        problem = "it is empty" if not parts else None
        if parts and (len(value.splitlines()) != 1 or parts[0] not in _KEY_TYPES or len(parts) < 2):
            problem = "it does not start with a key type such as ssh-ed25519"
        elif parts:
            try:
                blob = base64.b64decode(parts[1], validate=True)
                (size,) = struct.unpack(">I", blob[:4])
                if blob[4:4 + size].decode() != parts[0]:
                    problem = f"its key data is not a {parts[0]} key"
            except (binascii.Error, struct.error, UnicodeDecodeError):
                problem = "its key data is not base64 of an OpenSSH key"
        if problem:
            raise ValueError(f"the login key is not an OpenSSH public key ({problem}); pass the "
                             "one-line .pub file, like 'ssh-ed25519 AAAA... vmd', never the private key.")
        return value

    @field_validator("resolution", mode="before")
    @classmethod
    def _width_by_height(cls, value: Any) -> Any:
        if isinstance(value, str):
            m = re.fullmatch(r"\s*(\d{3,5})\s*[xX]\s*(\d{3,5})\s*", value)
            if not m:
                raise ValueError(f"the resolution {value!r} is not WIDTHxHEIGHT in pixels; "
                                 "use for example 1280x800 or 1024x768.")
            value = (int(m[1]), int(m[2]))
        width, height = value
        if not (640 <= int(width) <= 7680 and 480 <= int(height) <= 4320):
            raise ValueError(f"the resolution {width}x{height} is outside 640x480..7680x4320; "
                             "use for example 1280x800 or 1024x768.")
        return value

    @field_validator("hostname", "instance_id", "export_serial")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,19}", value):
            raise ValueError(f"{value!r} must be 1-20 letters, digits, dots or dashes.")
        return value


def make_seed(pubkey: str, resolution: str | tuple[int, int] = (1280, 800), **more: Any) -> Seed:
    """A checked Seed, or SeedError with one sentence per bad input."""
    try:
        return Seed(pubkey=pubkey, resolution=resolution, **more)
    except ValidationError as exc:
        raise SeedError(" ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())) from None


# --- the desktop, as in vmd/images/debian/rootfs -------------------------------------------------

DESKTOP_SERVICE = """\
[Unit]
Description=Desktop of the user agent on the guest's screen (openbox + xterm)
After=systemd-user-sessions.service systemd-udev-settle.service

[Service]
User=agent
WorkingDirectory=/home/agent
Environment=HOME=/home/agent
ExecStart=/usr/bin/xinit /home/agent/.xinitrc -- /usr/bin/Xorg :0 vt7 -nolisten tcp -keeptty -novtswitch
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
"""

XWRAPPER = """\
# The desktop service starts Xorg as the user `agent` without logind: let the wrapper do it.
allowed_users=anybody
needs_root_rights=yes
"""

XINITRC = """\
#!/bin/sh
# The agent sees the screen through screenshots at a fixed size: pin it.
xrandr -s {width}x{height} 2>/dev/null || true
xsetroot -solid '#2e3440'
xset s off -dpms s noblank
openbox &
wm=$!
# Open the terminal only once the window manager runs, so that it opens focused and
# typed text lands in it (a window mapped before openbox starts stays unfocused).
for _ in $(seq 100); do
    xprop -root _NET_SUPPORTING_WM_CHECK 2>/dev/null | grep -q 'window id' && break
    sleep 0.2
done
xterm -fn 9x15 -geometry 110x36+30+30 -title terminal -e bash -l &
wait $wm
"""

SSHD = """\
# vmd keeps one SSH transport per machine and opens a channel per command, several at once.
MaxSessions 64
PasswordAuthentication no
UseDNS no
"""

FSTAB = """\
# The host's project folder (virtio 9p, tag "project"); nofail so a guest without a share still boots.
project /mnt/project 9p trans=virtio,version=9p2000.L,msize=524288,cache=none,nofail 0 0
"""

# Runs last in runcmd. build.sh boots with an extra raw disk (serial `export_serial`) and reads
# back a tar of what it needs for direct kernel boot plus `build-ok` or `problems`: cloud-init
# powers off even when a module failed, so the poweroff alone does not mean success.
EXPORT_SCRIPT = """\
#!/bin/sh
set -u
dev=/dev/disk/by-id/virtio-{serial}
[ -b "$dev" ] || exit 0
out=$(mktemp -d)
kver=$(uname -r)
cp "/boot/vmlinuz-$kver" "$out/vmlinuz" && cp "/boot/initrd.img-$kver" "$out/initrd.img" \\
    || echo "no kernel or initrd for $kver in /boot" >> "$out/problems"
echo "$kver" > "$out/kernel-version"
findmnt -no UUID / > "$out/root-uuid"
cp /etc/os-release "$out/os-release"
for p in {packages}; do
    dpkg-query -W -f='${{Status}}' "$p" 2>/dev/null | grep -q 'install ok installed' \\
        || echo "package $p is not installed" >> "$out/problems"
done
id -u {user} | grep -qx 1000 || echo "user {user} is missing or not uid 1000" >> "$out/problems"
systemctl is-enabled -q desktop.service || echo "desktop.service is not enabled" >> "$out/problems"
for m in 9p 9pnet_virtio virtio_gpu; do
    modprobe -n -q "$m" || echo "kernel module $m is missing" >> "$out/problems"
done
[ -s "$out/problems" ] || echo ok > "$out/build-ok"
apt-get clean
fstrim -a >/dev/null 2>&1 || true
tar -cf "$dev" -C "$out" . && sync
"""


def user_data(seed: Seed) -> str:
    width, height = seed.resolution
    home = f"/home/{USER}"
    config: dict[str, Any] = {
        "users": [{
            "name": USER, "uid": 1000, "shell": "/bin/bash", "lock_passwd": True,
            "groups": ["sudo", "video", "render", "input", "tty"],
            "sudo": "ALL=(ALL) NOPASSWD:ALL",
            "ssh_authorized_keys": [seed.pubkey],
        }],
        "ssh_pwauth": False,
        "package_update": True,
        "package_upgrade": False,
        "packages": PACKAGES,
        "apt": {"debconf_selections": {
            "xwrapper": "xserver-xorg-legacy xserver-xorg-legacy/xwrapper/allowed_users select Anybody",
        }},
        "write_files": [
            {"path": "/etc/ssh/sshd_config.d/10-vmagent.conf", "content": SSHD, "permissions": "0644"},
            {"path": "/etc/fstab", "content": FSTAB, "append": True},
            {"path": "/usr/local/sbin/vmagent-export-build",
             "content": EXPORT_SCRIPT.format(serial=seed.export_serial, user=USER,
                                             packages=" ".join(PACKAGES)),
             "permissions": "0755"},
            # Deferred: after the user exists and the X packages are in (their postinst writes
            # Xwrapper.config, which this then replaces).
            {"path": "/etc/systemd/system/desktop.service", "content": DESKTOP_SERVICE,
             "permissions": "0644", "defer": True},
            {"path": "/etc/X11/Xwrapper.config", "content": XWRAPPER, "permissions": "0644",
             "defer": True},
            {"path": f"{home}/.xinitrc", "content": XINITRC.format(width=width, height=height),
             "owner": f"{USER}:{USER}", "permissions": "0755", "defer": True},
        ],
        "runcmd": [
            ["mkdir", "-p", PROJECT_PATH],
            # 9p and virtio_gpu live in linux-modules-extra on some Ubuntu kernels.
            ["sh", "-c", "modprobe -n -q 9pnet_virtio && modprobe -n -q virtio_gpu || "
                         "DEBIAN_FRONTEND=noninteractive apt-get install -y linux-modules-extra-$(uname -r)"],
            ["chown", "-R", f"{USER}:{USER}", home],
            ["systemctl", "daemon-reload"],
            # ssh itself is socket-activated on 24.04 and already on; enabling ssh.service too
            # would make it fight ssh.socket for port 22.
            ["systemctl", "enable", "desktop.service", "serial-getty@ttyS0.service"],
            ["systemctl", "mask", "apt-daily.timer", "apt-daily-upgrade.timer"],
            # The base image is built once; later boots have no seed and must not wait for one.
            ["touch", "/etc/cloud/cloud-init.disabled"],
            ["/usr/local/sbin/vmagent-export-build"],
        ],
        "power_state": {"mode": "poweroff", "message": "vmagent guest image configured", "timeout": 30,
                        "condition": True},
    }
    return "#cloud-config\n" + _dump(config)


def meta_data(seed: Seed) -> str:
    return _dump({"instance-id": seed.instance_id, "local-hostname": seed.hostname})


def network_config(seed: Seed) -> str:
    return _dump({"version": 2, "ethernets": {"wired": {"match": {"name": "en*"}, "dhcp4": True}}})


def write_seed(outdir: Path, seed: Seed) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, render in (("user-data", user_data), ("meta-data", meta_data),
                         ("network-config", network_config)):
        path = outdir / name
        path.write_text(render(seed))
        written.append(path)
    return written


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # File contents as literal blocks, so the seed reads like the files it writes.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the cloud-init NoCloud seed of the vmagent Ubuntu guest.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--pubkey", type=Path, required=True, help="the OpenSSH public key vmd logs in with")
    parser.add_argument("--resolution", default="1280x800", help="screen size, WIDTHxHEIGHT")
    parser.add_argument("--hostname", default="vmagent-guest")
    parser.add_argument("--instance-id", default="vmagent-ubuntu-1")
    args = parser.parse_args(argv)
    try:
        pubkey = args.pubkey.read_text()
    except OSError as exc:
        print(f"seed.py: cannot read the public key {args.pubkey}: {exc.strerror}.", file=sys.stderr)
        return 2
    try:
        seed = make_seed(pubkey, args.resolution, hostname=args.hostname, instance_id=args.instance_id)
    except SeedError as exc:
        print(f"seed.py: {exc}", file=sys.stderr)
        return 2
    for path in write_seed(args.outdir, seed):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
