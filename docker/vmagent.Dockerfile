# vmagent: the job service and its workers. No privileges: it reaches machines only
# through vmd's socket, as uid/gid 1001 (vmd's entrypoint gives the socket that group).
# BASE: see docker/vmd.Dockerfile.
ARG BASE=debian:12-slim
FROM ${BASE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv git ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml ./
COPY vmagent ./vmagent
COPY vmd ./vmd
COPY configs ./configs
COPY docker/openwebui-provision.py /app/docker/openwebui-provision.py
# libvirt-python is a dependency of the vmd half of the package; the service never
# imports it (nor does `python -m vmd.server.doctor --check socket --check ollama`, its health
# check), so it is left out here (it needs libvirt headers to build). The workers read web
# pages for the agent (vmagent/web/): trafilatura, readability-lxml, markdownify, pypdf.
# pip upgraded first: Debian's (23.x) stops with "Candidate is not for this requirement
# lxml[html-clean,html-clean]" on the web packages' two spellings of one extra.
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir --upgrade pip \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps . \
    && /opt/venv/bin/pip install --no-cache-dir "pydantic>=2.6" "httpx>=0.27" "ollama>=0.5.2" \
        "json-repair>=0.30" "fastapi>=0.110" "uvicorn>=0.29" "PyYAML>=6" "Pillow>=10" \
        "httpcore>=1.0" "certifi" "trafilatura>=2.0" "readability-lxml>=0.8" "markdownify>=0.13" "pypdf>=4"
# The head of the compose fleet (docker-compose.fleet.yml) runs the Ray head beside the job
# service: with RAY_VERSION set, Ray, and the folder its token is made in (a volume the
# hosts mount read-only; a new volume takes this folder's owner and mode). The one-host
# stack leaves it empty.
ARG RAY_VERSION=
RUN if [ -n "$RAY_VERSION" ]; then /opt/venv/bin/pip install --no-cache-dir "ray==$RAY_VERSION"; fi
RUN groupadd --gid 1001 vmagent && useradd --create-home --uid 1001 --gid 1001 vmagent \
    && mkdir -p /var/lib/vmagent/service /var/lib/vmagent/ray \
    && chown vmagent:vmagent /var/lib/vmagent/service /var/lib/vmagent/ray && chmod 0700 /var/lib/vmagent/ray
COPY docker/fleet-head.sh /app/docker/fleet-head.sh
USER vmagent
ENV PATH=/opt/venv/bin:$PATH VMAGENT_PROMPTS=/app/configs/agent
EXPOSE 8700
CMD ["python", "-m", "vmagent.service", "--host", "0.0.0.0", "--port", "8700"]
