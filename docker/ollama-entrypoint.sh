#!/bin/sh
# Serve, and pull the configured model on first start (a no-op once it is there).
# This shell stays as the server's parent, so it passes SIGTERM on: `docker compose stop`
# then stops Ollama cleanly instead of killing it after the grace period.
set -eu
ollama serve &
server=$!
trap 'kill -TERM "$server" 2>/dev/null || true' TERM INT
until ollama list >/dev/null 2>&1; do
    kill -0 "$server" 2>/dev/null || { wait "$server"; exit $?; }
    sleep 1
done
if ! ollama show "$OLLAMA_MODEL" >/dev/null 2>&1; then
    echo "ollama: pulling $OLLAMA_MODEL (first start)"
    ollama pull "$OLLAMA_MODEL" || echo "ollama: pulling $OLLAMA_MODEL failed; Ollama stays unhealthy until it is there"
fi
# `wait` returns early when the trap runs; wait again for the server to finish exiting.
wait "$server" || true
trap - TERM INT
wait "$server" 2>/dev/null || true
