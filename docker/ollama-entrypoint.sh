#!/bin/sh
# Serve, and pull the configured model on first start (a no-op once it is there).
set -eu
ollama serve &
server=$!
until ollama list >/dev/null 2>&1; do sleep 1; done
if ! ollama show "$OLLAMA_MODEL" >/dev/null 2>&1; then
    echo "ollama: pulling $OLLAMA_MODEL (first start)"
    ollama pull "$OLLAMA_MODEL"
fi
wait "$server"
