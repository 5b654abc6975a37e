#!/usr/bin/env bash
# Every CPU benchmark behind BENCHMARKS.md's summary, on this machine, in one go: builds the
# random-weight checkpoints it needs under MODELS (/tmp/deepinfer-models by default), runs
# the benchmarks and leaves each one's output under OUT (/tmp/deepinfer-bench), with a short
# table last. Needs a Release build in BUILD_DIR (build by default; scripts/setup.sh makes it).
#
#   scripts/cpu-bench.sh [STAGES]
#
# STAGES (comma-separated, default all of them): dense = the Llama-3.2-1B-shaped checkpoint's
# prompt processing and batch-1 decode (after 512 and 16 prompt tokens); deepseek = the
# DeepSeek-V2-Lite-shaped checkpoint (8 layers) in bf16 and FP8; engine = bench-engine
# throughput at 1, 8 and 32 concurrent requests (default, --batch-invariant,
# --async-scheduling) and the shared-prefix TTFT; server = the same 8 x 64-token work through
# `deepinfer serve` and 8 streaming HTTP clients; micro = the kernel, tokenizer and
# JSON-mask micro-benchmarks; tiers = the prefix cache's memory and disk tiers (TTFT, disk
# GB/s next to dd); replay = bounded replay's error on the sliding-window fixtures; router =
# one-token requests to a worker directly and through `deepinfer router`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
MODELS=${MODELS:-/tmp/deepinfer-models}
OUT=${OUT:-/tmp/deepinfer-bench}
STAGES=${1:-dense,deepseek,engine,server,micro,tiers,replay,router}
BIN="$BUILD_DIR/deepinfer"
mkdir -p "$MODELS" "$OUT"

make_dense() {
  [[ -f $MODELS/llama-1b/config.json ]] && return
  "$BIN" make-model --family llama --vocab 128256 --hidden 2048 --intermediate 8192 \
    --layers 16 --heads 32 --kv-heads 8 --head-dim 64 --max-position 131072 \
    --rope-theta 500000 --tie-embeddings \
    --rope-scaling '{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}' \
    "$MODELS/llama-1b" >/dev/null
  # The real Llama 3 tokenizer, for the server stage.
  cp "$BUILD_DIR"/tokenizers/llama3/tokenizer*.json "$MODELS/llama-1b/"
}

stage_dense() {
  make_dense
  "$BIN" bench "$MODELS/llama-1b" --prompt-tokens 512 --decode-tokens 32 | tee "$OUT/dense.txt"
  "$BIN" bench "$MODELS/llama-1b" --prompt-tokens 16 --decode-tokens 32 |
    tee "$OUT/dense-short.txt"
}

stage_deepseek() {
  local shape=(--family deepseek_v2 --vocab 102400 --hidden 2048 --intermediate 10944
    --heads 16 --q-lora-rank 0 --kv-lora-rank 512 --qk-nope-dim 128 --qk-rope-dim 64
    --v-head-dim 128 --experts 64 --shared-experts 2 --experts-per-token 6
    --moe-intermediate 1408 --dense-layers 1 --max-position 32768 --layers 8)
  for dtype in bf16 fp8; do
    [[ -f $MODELS/v2lite-$dtype/config.json ]] ||
      "$BIN" make-model "${shape[@]}" --dtype "$dtype" "$MODELS/v2lite-$dtype" >/dev/null
    "$BIN" bench "$MODELS/v2lite-$dtype" --prompt-tokens 512 --decode-tokens 32 |
      tee "$OUT/v2lite-$dtype.txt"
  done
}

stage_engine() {
  make_dense
  local common=(--concurrency 1,8,32 --prompt-tokens 128 --output-tokens 64)
  "$BIN" bench-engine "$MODELS/llama-1b" "${common[@]}" --shared-prefix-tokens 4096 \
    --unique-tokens 100 --prefix-requests 2 | tee "$OUT/engine.txt"
  "$BIN" bench-engine "$MODELS/llama-1b" "${common[@]}" --batch-invariant |
    tee "$OUT/engine-batch-invariant.txt"
  "$BIN" bench-engine "$MODELS/llama-1b" "${common[@]}" --async-scheduling |
    tee "$OUT/engine-async.txt"
}

# The prefix cache's tiers: TTFT of a 4,096-token shared prefix from memory, from the disk
# tier and absent; the disk tier's write and read GB/s next to dd's on the same directory
# (both read through the page cache, as the tier does).
stage_tiers() {
  make_dense
  local dir="$OUT/kv-cache"
  rm -rf "$dir"
  "$BIN" bench-engine "$MODELS/llama-1b" --concurrency 1 --prompt-tokens 16 --output-tokens 4 \
    --shared-prefix-tokens 4096 --unique-tokens 100 --prefix-requests 2 --kv-cache-dir "$dir" |
    tee "$OUT/tiers.txt"
  dd if=/dev/zero of="$dir/dd.bin" bs=1M count=512 conv=fsync 2>&1 | tail -1 |
    sed 's/^/dd write: /' | tee -a "$OUT/tiers.txt"
  dd if="$dir/dd.bin" of=/dev/null bs=1M 2>&1 | tail -1 | sed 's/^/dd read: /' |
    tee -a "$OUT/tiers.txt"
  rm -rf "$dir"
}

# Bounded replay's logit error against the cold prefill on the fixtures with sliding windows.
stage_replay() {
  local model
  for model in mistral-swa qwen3-hybrid-swa deepseek-v4-flash-style; do
    "$BIN" bench-replay "tests/fixtures/models/$model" --batch-invariant --block-size 4 \
      --prefix-tokens 128,256,512 | sed "s/^/$model: /" | tee -a "$OUT/replay.txt"
  done
}

# Waits (up to 10 minutes) until a server on PORT answers /health.
wait_healthy() {
  for _ in $(seq 1 3000); do
    curl -sf "localhost:$1/health" >/dev/null && return 0
    sleep 0.2
  done
  return 1
}

# 8 streaming clients at once, each 128 prompt ids and 64 output tokens (bench-engine's
# concurrency-8 work), timed from the first request to the last byte.
stage_server() {
  make_dense
  local port=18431 ids
  ids=$(python3 -c 'print(",".join(str(1000 + i * 7) for i in range(128)))')
  "$BIN" serve "$MODELS/llama-1b" --port "$port" --load read >"$OUT/server.log" 2>&1 &
  local server=$!
  trap 'kill $server 2>/dev/null || true' RETURN
  wait_healthy "$port"
  local body="{\"prompt\": [$ids], \"max_tokens\": 64, \"temperature\": 0, \"ignore_eos\": true,
    \"stream\": true, \"stream_options\": {\"include_usage\": true}}"
  local start end
  start=$(date +%s.%N)
  for client in $(seq 1 8); do
    curl -sN "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
      -d "$body" >"$OUT/server-client-$client.txt" &
  done
  wait $(jobs -p | grep -v "^$server$")
  end=$(date +%s.%N)
  curl -s "localhost:$port/metrics" >"$OUT/server-metrics.txt"
  python3 - "$start" "$end" "$OUT" <<'EOF' | tee "$OUT/server.txt"
import json, sys
start, end, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
tokens = 0
for client in range(1, 9):
    for line in open(f"{out}/server-client-{client}.txt"):
        if line.startswith("data: {"):
            usage = json.loads(line[6:]).get("usage")
            if usage:
                tokens += usage["completion_tokens"]
print(f"server: {tokens} output tokens in {end - start:.1f} s, {tokens / (end - start):.1f} output tokens/s")
EOF
}

# What the router adds to a request: 60 one-token chat requests to demo-code-target's worker
# directly and through `deepinfer router` in front of it, alternating; medians and p90.
stage_router() {
  local worker=18441 router=18440 model=tests/fixtures/models/demo-code-target
  "$BIN" serve "$model" --host 127.0.0.1 --port "$worker" --kv-cache-bytes 268435456 \
    >"$OUT/router-worker.log" 2>&1 &
  local worker_pid=$!
  "$BIN" router --worker-urls "http://127.0.0.1:$worker" --host 127.0.0.1 --port "$router" \
    >"$OUT/router.log" 2>&1 &
  local router_pid=$!
  trap 'kill $worker_pid $router_pid 2>/dev/null || true' RETURN
  wait_healthy "$worker"
  wait_healthy "$router"
  local body='{"model": "demo-code-target", "max_tokens": 1, "temperature": 0,
    "messages": [{"role": "user", "content": "def add(a, b):"}]}'
  local port
  for port in $worker $router; do
    curl -s -o /dev/null "localhost:$port/v1/chat/completions" -d "$body"
  done
  for _ in $(seq 1 60); do
    for port in $worker $router; do
      echo "$port $(curl -s -o /dev/null -w '%{time_total}' \
        "localhost:$port/v1/chat/completions" -d "$body")"
    done
  done >"$OUT/router-times.txt"
  python3 - "$OUT/router-times.txt" "$worker" <<'EOF' | tee "$OUT/router.txt"
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    port, seconds = line.split()
    times.setdefault(port, []).append(1000 * float(seconds))
for port, values in times.items():
    values.sort()
    where = "direct" if port == sys.argv[2] else "through the router"
    print(f"{where}: median {statistics.median(values):.2f} ms, "
          f"p90 {values[int(0.9 * len(values))]:.2f} ms")
EOF
}

stage_micro() {
  "$BUILD_DIR/kernels_bench" 2>&1 | tee "$OUT/kernels.txt"
  "$BUILD_DIR/tokenizer_bench" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    2>&1 | tee "$OUT/tokenizer.txt"
  "$BUILD_DIR/structured_bench" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    2>&1 | tee "$OUT/structured.txt"
}

lscpu | grep -E "Model name|^CPU\(s\)"
for stage in ${STAGES//,/ }; do
  echo "== $stage =="
  "stage_$stage"
done
echo
echo "== summary =="
for file in dense dense-short v2lite-bf16 v2lite-fp8; do
  [[ -f $OUT/$file.txt ]] && grep -E "roofline|decode|prompt" "$OUT/$file.txt" | sed "s/^/$file: /"
done
for file in engine engine-batch-invariant engine-async server tiers replay router; do
  [[ -f $OUT/$file.txt ]] && sed "s/^/$file: /" "$OUT/$file.txt"
done
exit 0
