#!/usr/bin/env bash
# The CUDA backend on the GPU machine, in one call: op parity against the CPU, then the
# benchmarks, with a short table last.
#
#   scripts/gpu-check.sh bundle   # here: build the CUDA targets into gpu-bundle/ (ignored)
#   scripts/gpu-check.sh run      # there (the device tool, carrying gpu-bundle): run them
#
# The GPU machine has nvcc but none of the Debian libraries the project builds against, so
# the binaries are built here (same CUDA 13.0) and carried with the one shared library they
# need beyond the system and CUDA's (libfmt). The tracked tree is over the tool's 64 MiB;
# scripts/device-tree.sh hides the large fixture models for the call.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=gpu-bundle

bundle() {
  cmake -S . -B build -G Ninja -DDEEPINFER_CUDA=ON >/dev/null
  cmake --build build -j"$(nproc)" --target cuda_kernels_test cuda_bench
  rm -rf "$BUNDLE" && mkdir -p "$BUNDLE"
  cp build/tests/cuda_kernels_test build/cuda_bench "$BUNDLE/"
  cp -L "$(ldd build/cuda_bench | awk '/libfmt/ {print $3}')" "$BUNDLE/"
  du -sh "$BUNDLE"
}

run() {
  local cuda_libs
  cuda_libs=$(dirname "$(find / -name 'libcublasLt.so.13*' -print -quit 2>/dev/null)")
  export LD_LIBRARY_PATH="$PWD/$BUNDLE:$cuda_libs:${LD_LIBRARY_PATH:-}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  local out=${OUT:-/tmp}
  "$BUNDLE/cuda_kernels_test" 2>&1 | tee "$out/parity.txt" | tail -15
  "$BUNDLE/cuda_bench" 2>&1 | tee "$out/bench.txt"
  echo
  echo "== summary =="
  grep -E "PASSED|FAILED|SKIPPED" "$out/parity.txt" | tail -3
  grep -E "^copy|decode weights|back to back|fp8|decode attention|TFLOP/s" "$out/bench.txt"
}

case "${1:-}" in
  bundle) bundle ;;
  run) run ;;
  *) echo "usage: $0 bundle|run" >&2; exit 2 ;;
esac
