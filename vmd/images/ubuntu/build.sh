#!/usr/bin/env bash
# Build the production Linux guest from Ubuntu's cloud image: one boot with a cloud-init
# NoCloud seed (seed.py) creates the user `agent`, installs sshd, git, a compiler and an
# openbox + xterm desktop, and powers off. Needs internet (the image and Ubuntu's archive).
#
#   vmd/images/ubuntu/build.sh OUTDIR
#
# OUTDIR receives disk.qcow2 (the read-only base), vmlinuz, initrd.img (for direct kernel
# boot, like the Debian image), id_ed25519 (the key vmd logs in with), first-boot.log and
# manifest.json. Run through `vmd images build ubuntu`. No root needed; KVM is used when
# /dev/kvm is usable, else TCG (much slower: count an hour or more).
#
# Settings (environment):
#   VMD_UBUNTU_IMAGE_URL    the cloud image (default: 24.04 "noble", current release)
#   VMD_UBUNTU_SUMS_URL     its SHA256SUMS (default: next to the image)
#   VMD_UBUNTU_CACHE        where the download is kept between builds
#   VMD_UBUNTU_RESOLUTION   screen size, WIDTHxHEIGHT (default 1280x800)
#   VMD_UBUNTU_DISK_SIZE    virtual size of the guest disk (default 16G)
#   VMD_UBUNTU_MEMORY_MIB, VMD_UBUNTU_CPUS, VMD_UBUNTU_TIMEOUT (s, default 7200)
#   VMD_PYTHON              a python with pydantic and PyYAML (default: the repo's .venv)
set -euo pipefail

out=${1:?usage: build.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
# Read by step() below; vmd/machines/images.py parses "STEP n/N text" lines for its progress display.
total_steps=7
step() { echo "STEP $1/$total_steps $2"; }
die() { echo "build.sh: $*" >&2; exit 1; }

url=${VMD_UBUNTU_IMAGE_URL:-https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img}
sums_url=${VMD_UBUNTU_SUMS_URL:-${url%/*}/SHA256SUMS}
cache=${VMD_UBUNTU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vmagent/ubuntu}
resolution=${VMD_UBUNTU_RESOLUTION:-1280x800}
disk_size=${VMD_UBUNTU_DISK_SIZE:-16G}
memory=${VMD_UBUNTU_MEMORY_MIB:-4096}
cpus=${VMD_UBUNTU_CPUS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}
limit=${VMD_UBUNTU_TIMEOUT:-7200}
python=${VMD_PYTHON:-}
if [ -z "$python" ]; then
    if [ -x "$here/../../../.venv/bin/python" ]; then python="$here/../../../.venv/bin/python"; else python=python3; fi
fi

for tool in curl sha256sum qemu-img qemu-system-x86_64 ssh-keygen tar; do
    command -v "$tool" >/dev/null || die "$tool is missing; install curl, qemu-utils, qemu-system-x86 and openssh-client."
done
if command -v cloud-localds >/dev/null; then iso_tool=cloud-localds
elif command -v genisoimage >/dev/null; then iso_tool=genisoimage
elif command -v xorriso >/dev/null; then iso_tool=xorriso
else die "no tool to make the seed ISO; install cloud-image-utils (cloud-localds) or genisoimage."
fi
"$python" -c 'import pydantic, yaml' 2>/dev/null \
    || die "$python lacks pydantic or PyYAML; set VMD_PYTHON to the project's venv python."

work=$(mktemp -d "${TMPDIR:-/var/tmp}/vmd-ubuntu-build.XXXXXX")
qemu_pid=
cleanup() {
    [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

file=${url##*/}
step 1 "download $file"
mkdir -p "$cache"
curl -fsSL --retry 3 -o "$work/SHA256SUMS" "$sums_url" || die "could not download $sums_url; this recipe needs internet."
want=$(awk -v f="$file" '$2 == f || $2 == "*" f {print $1; exit}' "$work/SHA256SUMS")
[ -n "$want" ] || die "$sums_url lists no $file; set VMD_UBUNTU_IMAGE_URL and VMD_UBUNTU_SUMS_URL to a matching pair."
if [ -f "$cache/$file" ] && echo "$want  $cache/$file" | sha256sum -c --status; then
    echo "  I: using the cached $cache/$file"
else
    curl -fL --retry 3 --progress-bar -o "$cache/$file.part" "$url" || die "could not download $url."
    mv "$cache/$file.part" "$cache/$file"
fi

step 2 "verify $file against SHA256SUMS"
echo "$want  $cache/$file" | sha256sum -c --status \
    || die "$file does not match its SHA256SUMS ($want); delete $cache/$file and retry."
# The sums file is signed; check the signature where the Ubuntu cloud image keyring is installed.
keyring=/usr/share/keyrings/ubuntu-cloudimage-keyring.gpg
if [ -f "$keyring" ] && command -v gpgv >/dev/null \
        && curl -fsSL -o "$work/SHA256SUMS.gpg" "$sums_url.gpg"; then
    gpgv --keyring "$keyring" "$work/SHA256SUMS.gpg" "$work/SHA256SUMS" 2>/dev/null \
        || die "the signature of $sums_url does not verify with $keyring."
    echo "  I: SHA256SUMS signature verified"
else
    echo "  I: SHA256SUMS signature not checked (install ubuntu-keyring and gpgv to check it)"
fi

step 3 "make the login key and the cloud-init seed ($resolution)"
ssh-keygen -q -t ed25519 -N '' -C vmd -f "$work/id_ed25519"
"$python" "$here/seed.py" "$work/seed" --pubkey "$work/id_ed25519.pub" --resolution "$resolution" >/dev/null
case $iso_tool in
    cloud-localds) cloud-localds -N "$work/seed/network-config" "$work/seed.iso" \
                       "$work/seed/user-data" "$work/seed/meta-data" ;;
    genisoimage) genisoimage -quiet -output "$work/seed.iso" -volid cidata -joliet -rock \
                     -graft-points "$work/seed/user-data" "$work/seed/meta-data" "$work/seed/network-config" ;;
    xorriso) xorriso -as mkisofs -quiet -output "$work/seed.iso" -volid cidata -joliet -rock \
                 "$work/seed/user-data" "$work/seed/meta-data" "$work/seed/network-config" ;;
esac

step 4 "prepare a $disk_size disk from the cloud image"
qemu-img convert -q -O qcow2 "$cache/$file" "$work/disk.qcow2"
qemu-img resize -q "$work/disk.qcow2" "$disk_size"   # cloud-init grows the root partition
truncate -s 1G "$work/export.raw"                      # the guest writes its tar of results here

if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then accel=kvm cpu=host; else accel=tcg,thread=multi cpu=max; fi
step 5 "first boot: cloud-init installs the packages and the desktop (${accel%%,*}, up to ${limit}s)"
# The guest's serial console goes to first-boot.log; cloud-init's stage lines and every 25th
# package set up are shown as "  I: " lines (vmd's progress display shows those).
timeout "$limit" qemu-system-x86_64 \
    -machine q35 -accel "$accel" -cpu "$cpu" -m "$memory" -smp "$cpus" \
    -display none -monitor none -serial "file:$work/first-boot.log" -no-reboot \
    -drive "file=$work/disk.qcow2,if=virtio,format=qcow2,discard=unmap" \
    -drive "file=$work/seed.iso,if=virtio,format=raw,readonly=on" \
    -drive "file=$work/export.raw,if=none,id=export,format=raw" \
    -device virtio-blk-pci,drive=export,serial=vmd-boot \
    -nic user,model=virtio-net-pci </dev/null &
qemu_pid=$!
shown=0
while kill -0 "$qemu_pid" 2>/dev/null; do
    sleep 5
    [ -f "$work/first-boot.log" ] || continue
    tr -d '\r' < "$work/first-boot.log" | tail -n +"$((shown + 1))" \
        | awk '/Cloud-init v\. .* (running|finished)/ { print "  I: " $0; next }
               /^Setting up / { if (++n % 25 == 1) print "  I: " $0 }'
    shown=$(tr -d '\r' < "$work/first-boot.log" | wc -l)
done
rc=0; wait "$qemu_pid" || rc=$?
qemu_pid=
if [ "$rc" = 124 ]; then
    tail -n 40 "$work/first-boot.log" | tr -d '\r'
    die "the first boot did not finish within ${limit}s (raise VMD_UBUNTU_TIMEOUT; TCG is slow)."
fi
[ "$rc" = 0 ] || { tail -n 40 "$work/first-boot.log" | tr -d '\r'; die "QEMU exited with $rc during the first boot."; }

step 6 "read back the kernel, initrd and the guest's own checks"
mkdir -p "$work/export"
# An all-zero disk reads as an empty archive: the guest never got to hand anything over.
{ tar -xf "$work/export.raw" -C "$work/export" 2>/dev/null && [ -f "$work/export/kernel-version" ]; } \
    || { tail -n 40 "$work/first-boot.log" | tr -d '\r'; die "the guest powered off without handing over its results (cloud-init failed early?); the console is above."; }
if [ ! -f "$work/export/build-ok" ]; then
    cat "$work/export/problems" 2>/dev/null || true
    die "the guest finished, but its checks failed (listed above)."
fi
kver=$(cat "$work/export/kernel-version")
root_uuid=$(cat "$work/export/root-uuid")
distro=$(. "$work/export/os-release" && echo "ubuntu-$VERSION_ID")

step 7 "compress to a qcow2 base and write the manifest"
mkdir -p "$out"
qemu-img convert -q -c -O qcow2 "$work/disk.qcow2" "$out/disk.qcow2"
chmod 0444 "$out/disk.qcow2"
install -m 0644 "$work/export/vmlinuz" "$out/vmlinuz"
install -m 0644 "$work/export/initrd.img" "$out/initrd.img"
install -m 0600 "$work/id_ed25519" "$out/id_ed25519"
tr -d '\r' < "$work/first-boot.log" > "$out/first-boot.log"
w=${resolution%x*} h=${resolution#*x}
cat > "$out/manifest.json" <<EOF
{
  "name": "ubuntu",
  "os_family": "linux",
  "distro": "$distro",
  "kernel_version": "$kver",
  "user": "agent",
  "project_path": "/mnt/project",
  "resolution": [$w, $h],
  "desktop": true,
  "disk": "disk.qcow2",
  "kernel": "vmlinuz",
  "initrd": "initrd.img",
  "kernel_args": "root=UUID=$root_uuid ro console=ttyS0,115200 quiet",
  "ssh_key": "id_ed25519"
}
EOF
echo "image ready: $out"
