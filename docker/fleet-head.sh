#!/bin/bash
# The compose fleet's head (docker-compose.fleet.yml): the Ray head and the job service.
#
# - The Ray head: `vmagent ray-node head` on this container's address on the fleet's network,
#   with token auth (the token made at the first start in RAY_AUTH_TOKEN_PATH, a volume the
#   hosts mount read-only), no dashboard, no guest slots. Nothing of Ray is published.
# - The job service (executor ray), started again when it stops: the jobs' shims run on in
#   their own sessions and the new service re-attaches to them, as on one host. When the Ray
#   head stops the container stops, and compose's restart policy starts both again.
set -euo pipefail

addr=$(python -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')
port=${VMAGENT_RAY_PORT:-6379}
vmagent ray-node head --address "$addr" --port "$port" --token-file "$RAY_AUTH_TOKEN_PATH" \
    --object-store-mb "${VMAGENT_RAY_OBJECT_STORE_MB:-80}" &
ray_pid=$!

# The service's driver needs the head's GCS and this node's raylet up.
for _ in $(seq 120); do
    if ! kill -0 "$ray_pid" 2>/dev/null; then
        echo "fleet-head: the Ray head did not start" >&2
        exit 1
    fi
    if python -c "import socket; socket.create_connection(('$addr', $port), 2).close()" 2>/dev/null \
        && ls /tmp/ray/session_latest/sockets/raylet >/dev/null 2>&1; then
        break
    fi
    sleep 1
done
export RAY_ADDRESS="${RAY_ADDRESS:-$addr:$port}"

while true; do
    python -m vmagent.service --host 0.0.0.0 --port 8700 &
    svc_pid=$!
    status=0
    wait -n "$ray_pid" "$svc_pid" || status=$?
    if ! kill -0 "$ray_pid" 2>/dev/null; then
        echo "fleet-head: the Ray head stopped; stopping the container" >&2
        kill "$svc_pid" 2>/dev/null || true
        exit 1
    fi
    echo "fleet-head: the job service stopped (exit $status); starting it again in 2 s" >&2
    sleep 2
done
