#!/usr/bin/env bash
# Soaks `deepinfer serve` on loopback: starts it on the repository's model, streams from
# SOAK_CLIENTS concurrent clients (1000) for SOAK_SECONDS (300) with SOAK_LEAVE_RATE (0.2) of
# them leaving mid-stream, checks that requests, KV blocks and descriptors come back to their
# baseline, then SIGTERMs the server under as many long streams and checks that every one
# ends whole or, past --shutdown-timeout (SOAK_SHUTDOWN_TIMEOUT, 60), with a 503 its client
# reads, and that the server exits 0. Extra arguments go to `deepinfer serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake --build "$BUILD_DIR" --target deepinfer soak >/dev/null
PORT=${SOAK_PORT:-18231}
CLIENTS=${SOAK_CLIENTS:-1000}
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

"$BUILD_DIR"/deepinfer serve tests/fixtures/models/demo-code-target --host 127.0.0.1 \
  --port "$PORT" --kv-cache-bytes 1073741824 --max-pending-requests $((CLIENTS * 2)) \
  --shutdown-timeout "${SOAK_SHUTDOWN_TIMEOUT:-60}" "$@" \
  >/tmp/deepinfer-soak-server.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  sleep 0.2
done

status=0
"$BUILD_DIR"/soak --port "$PORT" --pid "$SERVER" --clients "$CLIENTS" \
  --seconds "${SOAK_SECONDS:-300}" --leave-rate "${SOAK_LEAVE_RATE:-0.2}" --sigterm || status=$?
server_status=0
wait "$SERVER" || server_status=$?
trap - EXIT
echo "server exit status $server_status"
exit $((status | server_status))
