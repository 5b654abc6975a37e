#!/usr/bin/env bash
# The CUDA backend's checks and benchmarks on a GPU host (any machine with an sm_90 GPU, such
# as an H100 or H200): op parity and the fixtures against the CPU and transformers, then the
# benchmarks, with a short table last.
#
#   scripts/gpu-check.sh bundle        # on the build host: build the CUDA targets into
#                                      # gpu-bundle/ (ignored by git)
#   scripts/gpu-check.sh run [STAGES]  # on the GPU host, in a copy of the repository that
#                                      # holds gpu-bundle/
#
# STAGES (comma-separated, default check,kernels,model): check = op parity + fixture tests on
# the GPU (CHECK_EXCLUDE: more gtest patterns to leave out, colon-separated); kernels = kernel benchmarks (cuda_bench); model = a Llama-3.1-8B-shaped random bf16
# checkpoint: 8k-token prefill and batch-1 decode (deepinfer bench); decode = only its batch-1
# and batch-64 decode steps after a 512-token prompt (LABEL prefixes the lines: quick A/B
# runs); engine = 64 and 256 concurrent requests of 1000 + 1000 tokens (deepinfer
# bench-engine); tiers = time to first token after a 32k-token prefix recomputed, in memory,
# in the host-memory tier and on disk (bench-engine); peer = the same workloads through PyTorch/transformers (bench/torch_peer.py);
# structured = 32 requests held to a JSON Schema against 32 free (bench-engine on a
# Qwen3-0.6B-shaped checkpoint; carry build/tokenizers/qwen3); speculative = the 8B shape
# without speculation, with n-gram drafts and with a 1B-shaped draft model, and n-gram drafts
# on repetitive prompts against none (bench-engine);
# v4 = a DeepSeek-V4-Flash-shaped FP8 checkpoint with V4_LAYERS layers (4 by default; the
# disk holds about 8): 8k-token prefill, batch-1 decode after it, and batch-1 and batch-64
# decode steps at 8k and 64k cached tokens (deepinfer bench); profile = one batch-1 decode step's kernel times under Nsight Compute
# (scripts/step-profile.py); v4profile and v4prompt = the same for the V4 checkpoint's decode
# step and 8,192-token prompt; v4prefill = only that prompt's speed; v4decode = only the
# batch-1 and batch-64 decode steps at 8k; detail = Nsight Compute's sections for one layer's products and
# attention. ENGINE_CONCURRENCY, PEER_PHASES and PEER_CONCURRENCY narrow the engine and peer
# stages; ENGINE_ASYNC adds a run with --async-scheduling at that concurrency. BUNDLE names
# another bundle folder (gpu-bundle by default); OUT names the folder for logs (/tmp by
# default).
#
# A GPU host needs only the NVIDIA driver and the CUDA 13 runtime libraries (cuBLASLt): the
# binaries are built on the build host and carried, stripped, with the shared libraries they
# need beyond the system's and CUDA's. The check stage reads the fixture models under
# tests/fixtures/models and leaves out the tests of demo-code-target, the largest of them.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${BUNDLE:-gpu-bundle}
MODEL_8B=/tmp/deepinfer-llama-8b

bundle() {
  cmake -S . -B build -G Ninja -DDEEPINFER_CUDA=ON >/dev/null
  cmake --build build -j"$(nproc)" --target cuda_kernels_test cuda_bench deepinfer
  local staging
  staging=$(mktemp -d)
  cp build/tests/cuda_kernels_test build/cuda_bench build/deepinfer "$staging/"
  strip "$staging"/*
  for lib in libfmt libicuuc libicudata libpcre2-8 libxxhash; do
    cp -L "$(ldd build/deepinfer | awk -v l="$lib" '$1 ~ "^"l {print $3}')" "$staging/"
  done
  rm -rf "$BUNDLE" && mkdir -p "$BUNDLE"
  tar -C "$staging" -cJf "$BUNDLE/bundle.tar.xz" .
  rm -rf "$staging"
  du -sh "$BUNDLE"
}

unpack() {
  mkdir -p "$BUNDLE/bin"
  tar -C "$BUNDLE/bin" -xJf "$BUNDLE/bundle.tar.xz"
}

stage_check() {
  local out=$1
  DEEPINFER_FIXTURES="$PWD/tests/fixtures" "$BUNDLE/bin/cuda_kernels_test" \
    --gtest_filter="-*demo_code_target*${CHECK_EXCLUDE:+:$CHECK_EXCLUDE}" 2>&1 | tee "$out/parity.txt" | grep -vE "^\[ +(RUN|OK) " | tail -40
}

make_8b() {
  [[ -f $MODEL_8B/config.json ]] && return
  /usr/bin/time -f "make-model: %e s" "$BUNDLE/bin/deepinfer" make-model "$MODEL_8B" --family llama \
    --vocab 128256 --hidden 4096 --intermediate 14336 --layers 32 --heads 32 --kv-heads 8 \
    --max-position 131072 --rope-theta 500000 --max-shard-mib 5120 >/dev/null
}

MODEL_1B=/tmp/deepinfer-llama-1b

# Llama-3.2-1B's shapes with the 8B's vocabulary: a draft model for it.
make_1b() {
  [[ -f $MODEL_1B/config.json ]] && return
  "$BUNDLE/bin/deepinfer" make-model "$MODEL_1B" --family llama --vocab 128256 --hidden 2048 \
    --intermediate 8192 --layers 16 --heads 32 --kv-heads 8 --max-position 131072 \
    --rope-theta 500000 --tie-embeddings >/dev/null
}

MODEL_V4=/tmp/deepinfer-v4-flash

# DeepSeek-V4-Flash's shapes (hidden 4096, 64 heads x 512, q LoRA 1024, 8 output groups x 1024,
# 256 experts top-6 of width 2048 plus a shared one, window 128, indexer 64 x 128 top-512,
# hc_mult 4), CSA and HCA layers alternating, the first one hash-routed.
make_v4() {
  [[ -f $MODEL_V4/config.json ]] && return
  local layers=${V4_LAYERS:-4} ratios=() i
  for ((i = 0; i < layers; i++)); do ratios+=($(((i % 2) ? 128 : 4))); done
  /usr/bin/time -f "make-model: %e s" "$BUNDLE/bin/deepinfer" make-model "$MODEL_V4" \
    --family deepseek_v4 --vocab 129280 --hidden 4096 --layers "$layers" --heads 64 \
    --head-dim 512 --q-lora-rank 1024 --qk-rope-dim 64 --o-groups 8 --o-lora-rank 1024 \
    --experts 256 --experts-per-token 6 --moe-intermediate 2048 --shared-experts 1 \
    --sliding-window 128 --index-heads 64 --index-head-dim 128 --index-topk 512 --hc-mult 4 \
    --compress-ratios "$(IFS=,; echo "${ratios[*]}")" --hash-layers 1 --dtype fp8 \
    --max-position 1048576 --max-shard-mib 5120 >/dev/null
}

MODEL_QWEN3_SMALL=/tmp/deepinfer-qwen3-small

# Qwen3-0.6B's shapes with its real tokenizer (a constrained request needs the vocabulary's
# bytes).
make_qwen3_small() {
  [[ -f $MODEL_QWEN3_SMALL/config.json ]] && return
  "$BUNDLE/bin/deepinfer" make-model "$MODEL_QWEN3_SMALL" --family qwen3 --vocab 151936 \
    --hidden 1024 --intermediate 3072 --layers 28 --heads 16 --kv-heads 8 --head-dim 128 \
    --max-position 40960 --tie-embeddings >/dev/null
  cp "${TOKENIZER_QWEN3:-build/tokenizers/qwen3}"/* "$MODEL_QWEN3_SMALL/"
}

run() {
  local stages=${1:-check,kernels,model}
  local cuda_libs
  cuda_libs=$(dirname "$(find / -name 'libcublasLt.so.13*' -print -quit 2>/dev/null)")
  unpack
  export LD_LIBRARY_PATH="$PWD/$BUNDLE/bin:$cuda_libs:${LD_LIBRARY_PATH:-}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  local out=${OUT:-/tmp}
  # No timings of wrong code: a failing check ends the run.
  if [[ $stages == *check* ]] && ! stage_check "$out"; then
    echo "gpu-check: the GPU tests failed; benchmarks skipped" >&2
    return 1
  fi
  [[ $stages == *kernels* ]] && "$BUNDLE/bin/cuda_bench" 2>&1 | tee "$out/bench.txt"
  if [[ $stages == *model* || $stages == *engine* ]]; then make_8b; fi
  [[ $stages == *model* ]] && "$BUNDLE/bin/deepinfer" bench "$MODEL_8B" --device cuda --load read \
    --prompt-tokens 8192 --decode-tokens 128 --decode-batches 1,64,256 2>&1 | tee "$out/model.txt"
  # The same decode steps with every kernel launched the ordinary way (no overlap with the
  # previous kernel), to show what programmatic dependent launch gains.
  [[ $stages == *model* ]] && DEEPINFER_CUDA_OVERLAP=0 "$BUNDLE/bin/deepinfer" bench "$MODEL_8B" \
    --device cuda --load read --prompt-tokens 512 --decode-tokens 128 --decode-batches 1,64 2>&1 |
    grep -E "decode" | sed 's/^/no overlap: /' | tee -a "$out/model.txt"
  # decode: only batch-1 and batch-64 decode after a 512-token prompt, for quick comparisons
  # (LABEL prefixes its lines).
  if [[ ,$stages, == *,decode,* ]]; then
    make_8b
    "$BUNDLE/bin/deepinfer" bench "$MODEL_8B" --device cuda --load read --prompt-tokens 512 \
      --decode-tokens 128 --decode-batches 1,64 2>&1 | grep -E "^decode" |
      sed "s/^/${LABEL:-}/" | tee -a "$out/decode.txt"
  fi
  [[ $stages == *engine* ]] && "$BUNDLE/bin/deepinfer" bench-engine "$MODEL_8B" --device cuda \
    --load read --concurrency "${ENGINE_CONCURRENCY:-64,256}" --prompt-tokens 1000 --output-tokens 1000 \
    --max-running 256 --max-batched-tokens 8192 --kv-cache-fraction 0.9 2>&1 | tee "$out/engine.txt"
  # tiers: time to first token after a 32k-token shared prefix on the 8B shape, recomputed,
  # in device memory, in the host-memory tier and on disk (a folder on the GPU host's disk).
  if [[ $stages == *tiers* ]]; then
    make_8b
    rm -rf /tmp/deepinfer-kv && mkdir -p /tmp/deepinfer-kv
    "$BUNDLE/bin/deepinfer" bench-engine "$MODEL_8B" --device cuda --load read --concurrency 1 \
      --prompt-tokens 16 --output-tokens 4 --shared-prefix-tokens 32768 --unique-tokens 100 \
      --prefix-requests 2 --max-batched-tokens 8192 --kv-cache-fraction 0.5 --kv-host-bytes 8589934592 \
      --kv-cache-dir /tmp/deepinfer-kv 2>&1 | tee "$out/tiers.txt"
    # What the directory's disk does outside DeepInfer (one fsync for 2 GiB; the read after
    # dropping what it can of the page cache).
    dd if=/dev/zero of=/tmp/deepinfer-kv/dd.bin bs=1M count=2048 conv=fsync 2>&1 | tail -1 |
      sed 's/^/dd write: /' | tee -a "$out/tiers.txt"
    sync; echo 1 >/proc/sys/vm/drop_caches 2>/dev/null || true
    dd if=/tmp/deepinfer-kv/dd.bin of=/dev/null bs=1M 2>&1 | tail -1 | sed 's/^/dd read: /' |
      tee -a "$out/tiers.txt"
    rm -f /tmp/deepinfer-kv/dd.bin
  fi
  # ENGINE_ASYNC=64 (for example): the same at that concurrency with --async-scheduling.
  [[ $stages == *engine* && -n ${ENGINE_ASYNC:-} ]] && "$BUNDLE/bin/deepinfer" bench-engine \
    "$MODEL_8B" --device cuda --load read --concurrency "$ENGINE_ASYNC" --prompt-tokens 1000 \
    --output-tokens 1000 --max-running 256 --max-batched-tokens 8192 --kv-cache-fraction 0.9 \
    --async-scheduling 2>&1 | sed 's/^/async: /' | tee -a "$out/engine.txt"
  # profile: one batch-1 decode step's kernels under Nsight Compute (durations only; ncu
  # runs them one at a time, so the sum leaves out the gaps between kernels).
  if [[ ,$stages, == *,profile,* ]]; then
    make_8b
    ncu --clock-control none --metrics gpu__time_duration.sum --csv "$BUNDLE/bin/deepinfer" bench \
      "$MODEL_8B" --device cuda --load read --prompt-tokens 1500 --decode-tokens 2 \
      >"$out/profile.csv" 2>"$out/profile.log" || tail -5 "$out/profile.log"
    python3 scripts/step-profile.py "$out/profile.csv" | tee "$out/profile.txt"
  fi
  # detail: Nsight Compute's speed-of-light, memory, warp-stall and occupancy sections for one
  # layer's products and attention in a batch-1 decode step (DETAIL_KERNELS narrows them).
  if [[ $stages == *detail* ]]; then
    make_8b
    ncu --clock-control none --kernel-name "regex:${DETAIL_KERNELS:-few_rows|grouped_attention}" \
      --launch-skip 100 --launch-count "${DETAIL_COUNT:-5}" --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
      --section LaunchStats --section SchedulerStats "$BUNDLE/bin/deepinfer" bench "$MODEL_8B" \
      --device cuda --load read --prompt-tokens 1500 --decode-tokens 2 >"$out/detail.txt" \
      2>"$out/detail.log" || tail -5 "$out/detail.log"
    grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Registers|Achieved Occupancy|Theoretical Occupancy|No Eligible|Warp Cycles Per Issued|Block Limit" \
      "$out/detail.txt" | head -120
  fi
  if [[ ,$stages, == *,v4,* ]]; then
    make_v4
    # Decode steps at 64k cached tokens time the step itself (bench fills no real context).
    "$BUNDLE/bin/deepinfer" bench "$MODEL_V4" --device cuda --load read --prompt-tokens 8192 \
      --decode-tokens 16 --decode-prompt-tokens 8192 --decode-batches 1,64 \
      --decode-batch-context 8192 2>&1 | sed "s/^/v4 8k: /" | tee -a "$out/v4.txt"
    "$BUNDLE/bin/deepinfer" bench "$MODEL_V4" --device cuda --load read --prompt-tokens 512 \
      --decode-tokens 16 --decode-batches 1,64 --decode-batch-context 65536 2>&1 |
      sed "s/^/v4 64k: /" | tee -a "$out/v4.txt"
  fi
  # v4decode: only its batch-1 and batch-64 decode steps at 8,192 cached tokens (LABEL
  # prefixes the lines).
  if [[ $stages == *v4decode* ]]; then
    make_v4
    "$BUNDLE/bin/deepinfer" bench "$MODEL_V4" --device cuda --load read --prompt-tokens 128 \
      --decode-tokens 8 --decode-batches 1,64 --decode-batch-context 8192 2>&1 |
      grep -E "decode" | sed "s/^/${LABEL:-}v4 8k: /" | tee -a "$out/v4.txt"
  fi
  # v4prefill: only the same checkpoint's 8,192-token prompt (LABEL prefixes the lines: quick
  # A/B runs of two bundles).
  if [[ $stages == *v4prefill* ]]; then
    make_v4
    "$BUNDLE/bin/deepinfer" bench "$MODEL_V4" --device cuda --load read --prompt-tokens 8192 \
      --decode-tokens 1 2>&1 | grep -E "prompt|prefill" | sed "s/^/${LABEL:-}v4 8k: /" |
      tee -a "$out/v4.txt"
  fi
  if [[ $stages == *v4profile* ]]; then
    make_v4
    ncu --clock-control none --metrics gpu__time_duration.sum --csv "$BUNDLE/bin/deepinfer" bench \
      "$MODEL_V4" --device cuda --load read --prompt-tokens 8192 --decode-tokens 2 \
      >"$out/profile-v4.csv" 2>"$out/profile-v4.log" || tail -5 "$out/profile-v4.log"
    python3 scripts/step-profile.py "$out/profile-v4.csv" | tee "$out/profile-v4.txt"
  fi
  # v4prompt: the kernel times of the same checkpoint's 8,192-token prompt.
  if [[ $stages == *v4prompt* ]]; then
    make_v4
    ncu --clock-control none --metrics gpu__time_duration.sum --csv "$BUNDLE/bin/deepinfer" bench \
      "$MODEL_V4" --device cuda --load read --prompt-tokens 8192 --decode-tokens 1 \
      >"$out/prompt-v4.csv" 2>"$out/prompt-v4.log" || tail -5 "$out/prompt-v4.log"
    python3 scripts/step-profile.py --prompt "$out/prompt-v4.csv" | tee "$out/prompt-v4.txt"
  fi
  # structured: 32 concurrent requests held to a tool's JSON Schema against the same 32 free
  # (alternating, two runs each) on a Qwen3-0.6B-shaped checkpoint with the Qwen3 tokenizer
  # (TOKENIZER_QWEN3: its folder, carried from the build host).
  if [[ $stages == *structured* ]]; then
    make_qwen3_small
    local schema i
    schema=$(tr -d '\n' <bench/tool_schema.json)
    for i in 1 2; do
      "$BUNDLE/bin/deepinfer" bench-engine "$MODEL_QWEN3_SMALL" --device cuda --load read \
        --concurrency 32 --prompt-tokens 16 --output-tokens 256 \
        --structured-outputs "{\"json\": $schema}" 2>&1 | grep concurrency |
        sed "s/^/constrained: /" | tee -a "$out/structured.txt"
      "$BUNDLE/bin/deepinfer" bench-engine "$MODEL_QWEN3_SMALL" --device cuda --load read \
        --concurrency 32 --prompt-tokens 16 --output-tokens 256 2>&1 | grep concurrency |
        sed "s/^/free: /" | tee -a "$out/structured.txt"
    done
  fi
  # speculative: the 8B shape at 1, 8 and 32 concurrent requests (256 + 256 tokens) without
  # speculation, with n-gram drafts and with the 1B-shaped draft model (random weights: the
  # draft costs its forwards and is rarely accepted); then without speculation and with n-gram
  # drafts on repetitive prompts (a 16-id phrase said 16 times, given as token ids).
  if [[ $stages == *speculative* ]]; then
    make_8b
    make_1b
    rm -f "$out/speculative.txt"
    local repetitive="$out/repetitive.jsonl"
    awk 'BEGIN { for (p = 0; p < 16; ++p) { line = "{\"prompt_token_ids\": [";
      for (r = 0; r < 16; ++r) for (j = 0; j < 16; ++j)
        line = line (r + j ? ", " : "") (p * 131 + j * 977 + 7) % 32000;
      print line "]}" } }' >"$repetitive"
    local run config
    for run in "off" "ngram" "draft_model" "off repetitive" "ngram repetitive"; do
      case $run in
        off*) config="" ;;
        ngram*) config='{"method":"ngram"}' ;;
        draft_model) config="{\"method\":\"draft_model\",\"model\":\"$MODEL_1B\"}" ;;
      esac
      local prompts=(--prompt-tokens 256)
      [[ $run == *repetitive ]] && prompts=(--dataset-path "$repetitive")
      "$BUNDLE/bin/deepinfer" bench-engine "$MODEL_8B" --device cuda --load read \
        --concurrency "${SPEC_CONCURRENCY:-1,8,32}" "${prompts[@]}" --output-tokens 256 \
        --kv-cache-fraction 0.8 ${config:+--speculative-config "$config"} 2>&1 |
        grep -E "concurrency|accept" | sed "s|^|$run: |" | tee -a "$out/speculative.txt"
    done
  fi
  # PEER_PHASES (decode,prefill,throughput) and PEER_CONCURRENCY (64,256) fit the peer into
  # one call's 10 minutes: all phases take about 7.
  [[ $stages == *peer* ]] && python3 bench/torch_peer.py --out "$out" \
    --phases "${PEER_PHASES:-decode,prefill,throughput}" \
    --concurrency "${PEER_CONCURRENCY:-64,256}" 2>&1 | tee "$out/peer.txt"
  echo
  echo "== summary =="
  [[ -f $out/parity.txt ]] && grep -E "tests ran|PASSED|FAILED" "$out/parity.txt" | tail -4
  [[ -f $out/bench.txt ]] && grep -E "^copy|back to back|issues them|attention|TFLOP/s" "$out/bench.txt"
  [[ -f $out/model.txt ]] && grep -E "copy|peak|prompt|decode" "$out/model.txt"
  [[ -f $out/engine.txt ]] && tail -8 "$out/engine.txt"
  [[ -f $out/v4.txt ]] && grep -E "copy|peak|prompt|decode|KV" "$out/v4.txt"
  [[ -f $out/structured.txt ]] && cat "$out/structured.txt"
  [[ -f $out/speculative.txt ]] && cat "$out/speculative.txt"
  return 0
}

case "${1:-}" in
  bundle) bundle ;;
  run) run "${2:-}" ;;
  *) echo "usage: $0 bundle | run [STAGES]" >&2; exit 2 ;;
esac
