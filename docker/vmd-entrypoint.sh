#!/bin/sh
# libvirtd and virtlogd run inside the vmd container; vmd talks to them over qemu:///system.
# PID 1 is docker's init (`init: true`): it reaps the daemons' children and hands SIGTERM
# to vmd, which closes its sessions' guests before it exits.
set -eu
mkdir -p /run/vmd /run/libvirt /var/lib/vmagent/state /var/lib/vmagent/images /var/lib/vmagent/projects

# The job service runs as another user (uid/gid 1001 in its image). vmd makes its socket
# 0660; its folder, with the service's group and the setgid bit, gives the socket that
# group, so the service can connect and nobody else can.
group=${VMD_SOCKET_GROUP:-1001}
chgrp "$group" /run/vmd
chmod 2750 /run/vmd

# KVM when the host has it, TCG otherwise: the compose file allows the device (a cgroup
# rule) rather than requiring it (`devices:` would keep the container from starting on a
# host without /dev/kvm). The node is made here and kept only if it opens; vmd then asks
# QEMU whether KVM really starts. QEMU's user reaches it through the kvm group, as udev
# gives it on a host.
if [ ! -e /dev/kvm ]; then
    mknod -m 0660 /dev/kvm c 10 232 2>/dev/null || true
fi
if [ -e /dev/kvm ]; then
    if (exec 3<>/dev/kvm) 2>/dev/null; then
        chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
    else
        rm -f /dev/kvm 2>/dev/null || true
        echo "vmd: no usable /dev/kvm on this host; guests run under TCG (about 4x slower)"
    fi
fi

virtlogd -d
libvirtd -d
until virsh -c qemu:///system version >/dev/null 2>&1; do sleep 1; done

if [ -n "${GITEA_TOKEN_FILE:-}" ] && [ -s "$GITEA_TOKEN_FILE" ]; then
    GITEA_TOKEN=$(cat "$GITEA_TOKEN_FILE")
    export GITEA_TOKEN
fi

# The debian guest image is built from its recipe on first start (a no-op once built).
# build.sh takes the Debian mirror from VMD_APT_MIRROR, else from apt's index targets,
# which exist only once the package lists are there (the image leaves them out).
# The health check (python -m vmd.server.doctor) says "being built" meanwhile, and vmd is
# healthy only once it is built and serving.
if [ -z "${VMD_APT_MIRROR:-}" ]; then
    apt-get update -qq || echo "vmd: apt-get update failed; set VMD_APT_MIRROR to a Debian mirror"
fi
vmd images build debian || echo "vmd: building the debian image failed; \`docker compose exec vmd python -m vmd.server.doctor\` says why"
if [ -n "${VMAGENT_FLEET_HEAD:-}" ]; then
    # A host of the compose fleet (docker-compose.fleet.yml): its Ray node beside vmd.
    /bin/sh /usr/local/bin/fleet-host-node.sh &
fi
exec vmd serve
