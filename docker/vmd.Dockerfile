# vmd: the privileged supervisor, with libvirtd, virtlogd and QEMU inside.
FROM debian:12-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils ovmf \
        python3 python3-venv python3-dev build-essential pkg-config libvirt-dev \
        git openssh-client genisoimage debootstrap ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml ./
COPY vmd ./vmd
COPY vmagent ./vmagent
COPY images ./images
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir .
ENV PATH=/opt/venv/bin:$PATH
COPY docker/vmd-entrypoint.sh /usr/local/bin/vmd-entrypoint.sh
VOLUME ["/var/lib/vmagent/images", "/var/lib/vmagent/state", "/var/lib/vmagent/projects", "/run/vmd"]
ENTRYPOINT ["/bin/sh", "/usr/local/bin/vmd-entrypoint.sh"]
