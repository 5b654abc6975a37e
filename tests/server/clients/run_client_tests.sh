#!/usr/bin/env bash
# Starts `deepinfer serve` on a free port and runs the official npm clients against it.
# Usage: run_client_tests.sh DEEPINFER MODEL_DIR NODE_MODULES_PARENT SCRIPT...
set -euo pipefail
BINARY=$1 MODEL_DIR=$2 CLIENTS=$3
shift 3
LOG=$(mktemp)
"$BINARY" serve "$MODEL_DIR" --host 127.0.0.1 --port 0 --api-key sk-test \
  --served-model-name demo --kv-cache-bytes 268435456 >"$LOG" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 1 300); do
  PORT=$(sed -n 's/.* on http:\/\/127.0.0.1:\([0-9]*\) .*/\1/p' "$LOG")
  [[ -n "$PORT" ]] && break
  kill -0 $SERVER 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.1
done
[[ -n "$PORT" ]] || { echo "server did not start"; cat "$LOG"; exit 1; }
# ES modules resolve packages from their own folder up, so the scripts run from beside the
# installed node_modules.
for script in "$@"; do
  cp "$script" "$CLIENTS/"
  BASE_URL="http://127.0.0.1:$PORT" API_KEY=sk-test MODEL=demo node "$CLIENTS/$(basename "$script")"
done
