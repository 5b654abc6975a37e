#!/usr/bin/env bash
# Starts `deepinfer serve` on a free port and runs the official npm clients against it; with
# --routed, two `deepinfer serve` workers behind `deepinfer router`, the clients talking to the
# router.
# Usage: run_client_tests.sh [--routed] DEEPINFER MODEL_DIR NODE_MODULES_PARENT SCRIPT...
set -euo pipefail
ROUTED=0
[[ ${1:-} == --routed ]] && { ROUTED=1; shift; }
BINARY=$1 MODEL_DIR=$2 CLIENTS=$3
shift 3
LOGS=$(mktemp -d)
PIDS=()
trap 'for pid in "${PIDS[@]}"; do kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; done; rm -rf "$LOGS"' EXIT

# Starts a deepinfer command (its log in $LOGS/NAME) and sets PORT to the port it announces.
start() {
  local name=$1
  shift
  "$BINARY" "$@" --host 127.0.0.1 --port 0 --api-key sk-test >"$LOGS/$name" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  PORT=""
  for _ in $(seq 1 300); do
    PORT=$(sed -n 's/.* on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$LOGS/$name")
    [[ -n "$PORT" ]] && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$LOGS/$name"; exit 1; }
    sleep 0.1
  done
  echo "$name did not start"
  cat "$LOGS/$name"
  exit 1
}

serve=(serve "$MODEL_DIR" --served-model-name demo --kv-cache-bytes 268435456)
if ((ROUTED)); then
  start worker1 "${serve[@]}"
  WORKER1=$PORT
  start worker2 "${serve[@]}"
  start router router --worker-urls "http://127.0.0.1:$WORKER1,http://127.0.0.1:$PORT"
else
  start server "${serve[@]}"
fi
# ES modules resolve packages from their own folder up, so the scripts run from beside the
# installed node_modules.
for script in "$@"; do
  cp "$script" "$CLIENTS/"
  BASE_URL="http://127.0.0.1:$PORT" API_KEY=sk-test MODEL=demo node "$CLIENTS/$(basename "$script")"
done
