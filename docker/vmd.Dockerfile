# vmd: the privileged supervisor, with libvirtd, virtlogd and QEMU inside.
# BASE is the public Debian 12 image; a host that cannot pull images builds its own and
# passes it (docker/ci/build-base.sh, VMAGENT_BASE_IMAGE in .env).
ARG BASE=debian:12-slim
FROM ${BASE}
# python3-libvirt from Debian (the venv sees it): no compiler or libvirt headers in the image.
# debootstrap, e2fsprogs, qemu-utils and openssh-client build the guest image on first
# start; tesseract reads the screen as text for models without vision, and xfonts-base
# holds the guests' terminal font, whose text vmd reads cell by cell (vmd/machines/terminal_cells.py).
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils \
        python3 python3-venv python3-libvirt \
        git openssh-client genisoimage debootstrap e2fsprogs ca-certificates \
        tesseract-ocr tesseract-ocr-eng xfonts-base nftables \
    && rm -rf /var/lib/apt/lists/*
# libvirtd in a container, with the capabilities the compose file grants and no more:
# - namespaces: a private mount namespace per guest needs CAP_SYS_ADMIN; the container
#   already is one.
# - cgroup_controllers: the container's cgroup tree is read-only; Docker's own limits on
#   the container hold the guests too.
# - remember_owner: keeps files' first owners in trusted.* xattrs, which need CAP_SYS_ADMIN.
# QEMU still runs as libvirt-qemu (vmd puts a static DAC label on every guest) and the
# project share is mapped, as scripts/setup.sh sets a host up: nothing here runs it as root.
RUN printf '%s\n' 'namespaces = [ ]' 'cgroup_controllers = [ ]' 'remember_owner = 0' \
        'security_driver = "none"' >> /etc/libvirt/qemu.conf
WORKDIR /app
COPY pyproject.toml ./
COPY vmd ./vmd
COPY vmagent ./vmagent
# Editable: vmd finds its image recipes among its sources (/app/vmd/images), as in a clone.
# pip upgraded first: Debian's (23.x) stops with "Candidate is not for this requirement
# lxml[html-clean,html-clean]" on the web packages' two spellings of one extra.
RUN python3 -m venv --system-site-packages /opt/venv && /opt/venv/bin/pip install --no-cache-dir --upgrade pip \
    && /opt/venv/bin/pip install --no-cache-dir -e . \
    && mkdir -p /var/lib/vmagent/images /var/lib/vmagent/state /var/lib/vmagent/projects /run/vmd \
    && chmod 0755 /var/lib/vmagent /var/lib/vmagent/images /var/lib/vmagent/state /var/lib/vmagent/projects
ENV PATH=/opt/venv/bin:$PATH
# A host of the compose fleet (docker-compose.fleet.yml) runs a Ray node beside vmd, as the
# user 1001 (vmd's socket group, as the job service is on one host): with RAY_VERSION set,
# Ray and that user; the one-host stack leaves it empty and gets neither. Last, so that both
# stacks share every layer above.
ARG RAY_VERSION=
RUN if [ -n "$RAY_VERSION" ]; then /opt/venv/bin/pip install --no-cache-dir "ray==$RAY_VERSION" \
        && groupadd --gid 1001 vmagent && useradd --create-home --uid 1001 --gid 1001 vmagent; fi
COPY docker/vmd-entrypoint.sh docker/fleet-host-node.sh /usr/local/bin/
VOLUME ["/var/lib/vmagent/images", "/var/lib/vmagent/state", "/var/lib/vmagent/projects", "/run/vmd"]
ENTRYPOINT ["/bin/sh", "/usr/local/bin/vmd-entrypoint.sh"]
