#!/bin/sh
# libvirtd and virtlogd run inside the vmd container; vmd talks to them over qemu:///system.
set -eu
mkdir -p /run/vmd /run/libvirt /var/lib/vmagent/state /var/lib/vmagent/images /var/lib/vmagent/projects
# QEMU runs as libvirt-qemu and must write the shared project folders.
chown -R libvirt-qemu:kvm /var/lib/vmagent/projects 2>/dev/null || true
virtlogd -d
libvirtd -d
until virsh -c qemu:///system version >/dev/null 2>&1; do sleep 1; done
if [ -n "${GITEA_TOKEN_FILE:-}" ] && [ -s "$GITEA_TOKEN_FILE" ]; then
    GITEA_TOKEN=$(cat "$GITEA_TOKEN_FILE")
    export GITEA_TOKEN
fi
# The debian guest image is built from its recipe on first start (from the apt mirror).
if ! vmd images list 2>/dev/null | grep -q '^debian'; then
    vmd images build debian || echo "vmd: building the debian image failed; jobs will say so"
fi
exec vmd serve
