#!/usr/bin/env bash
# docker-compose with the CI override (docker/ci/compose.ci.yml), on a host that cannot pull
# images: builds the local Debian base (cached), finds the cached Open WebUI environment
# and guest images, and passes every other argument to docker-compose.
#
#   sudo scripts/compose-ci.sh up -d --build
#   sudo scripts/compose-ci.sh ps
#   sudo scripts/compose-ci.sh down -v
#   sudo scripts/compose-ci.sh --fleet up -d   # the compose fleet instead (docker-compose.fleet.yml,
#                                              # docker/ci/fleet.ci.yml): no Open WebUI in it
#
# COMPOSE (default: docker-compose, v1 as Debian ships it; "docker compose" for v2) and
# COMPOSE_PROJECT_NAME (default vmagent-ci) may be set; so may the ports (VMAGENT_PORT,
# GITEA_PORT, OPEN_WEBUI_PORT) and the secrets, which default to throwaway CI values.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's docker CLI (20.10, as its dockerd) before any other on PATH.
export PATH=/usr/bin:/usr/sbin:$PATH
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-vmagent-ci}
# BuildKit honours docker/*.Dockerfile.dockerignore: only what the images need is sent.
export COMPOSE_DOCKER_CLI_BUILD=1 DOCKER_BUILDKIT=1

files=(-f docker-compose.yml -f docker/ci/compose.ci.yml)
if [ "${1:-}" = "--fleet" ]; then
    shift
    files=(-f docker-compose.fleet.yml -f docker/ci/fleet.ci.yml)
fi

base=$(bash docker/ci/build-base.sh)
export VMAGENT_BASE_IMAGE=$base VMAGENT_CI_TAG=${base#*:}

if [ "${files[1]}" = docker-compose.yml ]; then
    openwebui=$(.venv/bin/python -c 'from tests.support.openwebui_harness import installed; print(installed() or "")')
    [ -n "$openwebui" ] || { echo "compose-ci.sh: the Open WebUI environment is not installed; run .venv/bin/python -m tests.support.openwebui_harness install" >&2; exit 1; }
    export VMAGENT_CI_OPENWEBUI_ENV=$openwebui
    VMAGENT_CI_PYTHON_HOME=$(dirname "$(sed -n 's/^home = //p' "$openwebui/pyvenv.cfg")")
    export VMAGENT_CI_PYTHON_HOME
fi
# The fleet's Ray, the version this clone's tests run (every node and the head must match).
RAY_VERSION=${RAY_VERSION:-$(.venv/bin/python -c 'import ray; print(ray.__version__)' 2>/dev/null || echo 2.60.0)}
export RAY_VERSION
export VMAGENT_CI_IMAGES_DIR=${VMAGENT_CI_IMAGES_DIR:-${VMD_IMAGES_DIR:-/var/lib/vmagent/images}}

# Throwaway secrets for a stack that lives for one test run.
export VMAGENT_SERVICE_TOKEN=${VMAGENT_SERVICE_TOKEN:-ci-service-token}
export VMAGENT_TOKENS=${VMAGENT_TOKENS:-ci-user-token:ci}
export GITEA_ADMIN_PASSWORD=${GITEA_ADMIN_PASSWORD:-ci-gitea-password}
export GITEA_STANDIN_TOKEN=${GITEA_STANDIN_TOKEN:-ci-gitea-token}
export WEBUI_SECRET_KEY=${WEBUI_SECRET_KEY:-ci-webui-secret}
export OPEN_WEBUI_ADMIN_PASSWORD=${OPEN_WEBUI_ADMIN_PASSWORD:-ci-webui-password}
export VMAGENT_MODEL=${VMAGENT_MODEL:-qwen3:32b}

exec ${COMPOSE:-docker-compose} "${files[@]}" "$@"
