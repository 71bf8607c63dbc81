# CI only: python3 and git on the local Debian base, for the stand-ins (docker/ci/standins.py)
# and for Open WebUI run from the cached environment tests/support/openwebui_harness.py installs
# (its interpreter's shared libraries: the CI host's Python is built against these).
ARG BASE
FROM ${BASE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 git ca-certificates libssl3 libffi8 libsqlite3-0 libbz2-1.0 liblzma5 \
        libreadline8 libncursesw6 zlib1g libgomp1 libstdc++6 \
    && rm -rf /var/lib/apt/lists/*
