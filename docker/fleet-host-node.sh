#!/bin/sh
# A host of the compose fleet (docker-compose.fleet.yml): its Ray node, started beside vmd by
# docker/vmd-entrypoint.sh when VMAGENT_FLEET_HEAD names the head.
#
# The node runs as the user 1001, in vmd's socket group (the job service's user on one host),
# never as root: a job's worker runs under it and reaches vmd through the socket only.
# `vmagent ray-node host` waits for the head and checks its token before it joins; when the
# head does not answer, or refuses the token, it says so here (the container's log) and exits,
# and this loop tries again: the host never hangs silently on a head it cannot reach.
set -u
socket=${VMD_SOCKET:-/run/vmd/vmd.sock}
head=${VMAGENT_FLEET_HEAD}
while true; do
    # vmd first: its socket's folder is given the group at start (vmd-entrypoint.sh).
    until [ -S "$socket" ]; do sleep 1; done
    setpriv --reuid=1001 --regid=1001 --clear-groups env HOME=/home/vmagent \
        vmagent ray-node host --head "$head" --name "${VMAGENT_HOST_NAME:?}" \
        --slots "${VMAGENT_HOST_SLOTS:-1}" --os "${VMAGENT_HOST_OS:-linux}" --vmd-socket "$socket" \
        --num-cpus "${VMAGENT_HOST_CPUS:-2}" --token-file "${RAY_AUTH_TOKEN_PATH:?}" \
        --object-store-mb "${VMAGENT_RAY_OBJECT_STORE_MB:-80}" --wait-s "${VMAGENT_HEAD_WAIT_S:-120}"
    echo "fleet-host: the Ray node of ${VMAGENT_HOST_NAME} stopped (exit $?); starting it again in 5 s" >&2
    sleep 5
done
