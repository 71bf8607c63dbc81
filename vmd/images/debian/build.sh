#!/usr/bin/env bash
# Build the default Linux guest: Debian (the host's own suite and apt mirror, nothing
# else is downloaded) with sshd, a user `agent`, and an openbox + xterm desktop that
# logs in by itself on the guest's screen.
#
#   images/debian/build.sh OUTDIR
#
# OUTDIR receives disk.qcow2 (the read-only base), vmlinuz, initrd.img, id_ed25519
# (the key vmd logs in with) and manifest.json. Run through `vmd images build debian`,
# which skips the build when an image of the same recipe hash exists.
set -euo pipefail

out=${1:?usage: build.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
# Read by step() below; the Python side parses "STEP n/N text" lines for its progress display.
total_steps=7
step() { echo "STEP $1/$total_steps $2"; }

[ "$(id -u)" = 0 ] || { echo "build.sh must run as root (debootstrap and chroot need it)" >&2; exit 1; }

# The mirror and suite come from the host's apt configuration, so the recipe names no host.
mirror=${VMD_APT_MIRROR:-$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' \
    | awk '$3 == "main" && $2 !~ /-/ {print $1; exit}')}
suite=${VMD_APT_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME}")}
[ -n "$mirror" ] || { echo "no Debian mirror found in the host's apt sources; set VMD_APT_MIRROR" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/var/tmp}/vmd-debian-build.XXXXXX")
root="$work/root"
cleanup() {
    for m in proc sys dev/pts dev; do umount -l "$root/$m" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

packages=$(grep -v '^#' "$here/packages.txt" | tr -s ' \n' ',' | sed 's/^,//; s/,$//')

step 1 "debootstrap $suite (minbase + $(echo "$packages" | tr ',' '\n' | wc -l) packages) from the host's mirror"
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" \
    | grep --line-buffered -E '^I: (Retrieving|Unpacking|Configuring) ' | awk '{ if (NR % 25 == 0) print "  " $0; fflush() }'

step 2 "configure the system (user, sshd, network, project share, desktop)"
cp -a "$here/rootfs/." "$root/"
echo vmagent-guest > "$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 vmagent-guest\n' > "$root/etc/hosts"
cat > "$root/etc/fstab" <<'EOF'
/dev/vda / ext4 defaults,noatime 0 1
# The host's project folder (virtio 9p, tag "project"); nofail so a guest without a share still boots.
project /mnt/project 9p trans=virtio,version=9p2000.L,msize=524288,cache=none,nofail 0 0
EOF
mkdir -p "$root/mnt/project"
chroot "$root" /bin/sh -eu <<'EOF'
useradd -m -u 1000 -s /bin/bash -G sudo,video,render,input,tty agent
cp -rn /etc/skel/. /home/agent/  # the recipe's own files came first, so useradd skipped skel
passwd -d agent >/dev/null
echo 'agent ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/agent
chmod 0440 /etc/sudoers.d/agent
chown -R agent:agent /home/agent
systemctl enable systemd-networkd ssh desktop.service serial-getty@ttyS0.service >/dev/null 2>&1
# e2scrub_reap looks for LVM snapshots this guest never has: 10-15 s of TCG time at each boot.
systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer >/dev/null 2>&1 || true
ln -sf /usr/share/zoneinfo/UTC /etc/localtime
rm -f /etc/ssh/ssh_host_*
ssh-keygen -A >/dev/null
# Without a valid font cache, openbox spends 20-60 s of TCG time building one at every boot.
# fontconfig holds a cache valid only while its folder's mtime, nanoseconds included, is
# the one it saw; mkfs.ext4 -d below copies mtimes to the second and drops the rest, which
# made every cache stale in the guest. Whole seconds here survive the copy.
find /usr/share/fonts /usr/share/X11/fonts /usr/local/share/fonts -xdev -type d \
    -exec touch -m -d @1700000000 {} + 2>/dev/null || true
fc-cache -s >/dev/null 2>&1 || true
su agent -c 'fc-cache >/dev/null 2>&1' || true
EOF

step 3 "install the login key"
ssh-keygen -q -t ed25519 -N '' -C vmd -f "$work/id_ed25519"
install -d -m 0700 -o 1000 -g 1000 "$root/home/agent/.ssh"
install -m 0600 -o 1000 -g 1000 "$work/id_ed25519.pub" "$root/home/agent/.ssh/authorized_keys"

step 4 "build the initrd with virtio and 9p drivers"
printf 'virtio_pci\nvirtio_blk\nvirtio_net\n9p\n9pnet_virtio\next4\n' >> "$root/etc/initramfs-tools/modules"
# Only those modules (and what they need): the default "most" made a 35 MB initrd that the
# guest kernel spent 5 s of TCG time unpacking at each boot.
sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
kver=$(ls "$root/lib/modules" | sort -V | tail -n1)
chroot "$root" update-initramfs -c -k "$kver" >/dev/null
chroot "$root" apt-get clean

step 5 "make the ext4 filesystem image"
mkdir -p "$out"
cp "$root/boot/vmlinuz-$kver" "$out/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$out/initrd.img"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/tmp/*
truncate -s 8G "$work/disk.raw"
mkfs.ext4 -q -L root -d "$root" "$work/disk.raw"

step 6 "convert to a compressed qcow2 base"
qemu-img convert -q -c -f raw -O qcow2 "$work/disk.raw" "$out/disk.qcow2"
chmod 0444 "$out/disk.qcow2"
install -m 0600 "$work/id_ed25519" "$out/id_ed25519"

step 7 "write the manifest"
cat > "$out/manifest.json" <<EOF
{
  "name": "debian",
  "os_family": "linux",
  "distro": "debian-$suite",
  "kernel_version": "$kver",
  "user": "agent",
  "project_path": "/mnt/project",
  "resolution": [1280, 800],
  "desktop": true,
  "disk": "disk.qcow2",
  "kernel": "vmlinuz",
  "initrd": "initrd.img",
  "kernel_args": "root=/dev/vda rw console=ttyS0,115200 quiet",
  "ssh_key": "id_ed25519"
}
EOF
echo "image ready: $out"
