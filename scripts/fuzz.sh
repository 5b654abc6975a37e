#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in their own folder and runs each under
# ctest for DEEPINFER_FUZZ_SECONDS (default 20). A crash, a leak, an unexpected exception or a
# hang fails the run; the input that did it is left in $FUZZ_DIR/crashes.
#   scripts/fuzz.sh                 build and run every target
#   DEEPINFER_FUZZ_SECONDS=600 scripts/fuzz.sh   a longer run
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ is missing; scripts/setup.sh installs it" >&2
  exit 1
fi

FUZZ_DIR=${FUZZ_DIR:-build-fuzz}
SECONDS_EACH=${DEEPINFER_FUZZ_SECONDS:-20}
cmake -S . -B "$FUZZ_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DDEEPINFER_FUZZ=ON -DDEEPINFER_BUILD_TESTS=OFF -DDEEPINFER_CUDA=OFF -DDEEPINFER_WERROR=ON \
  -DDEEPINFER_FUZZ_SECONDS="$SECONDS_EACH" >/dev/null
cmake --build "$FUZZ_DIR" --target deepinfer_fuzzers --parallel "$(nproc)"
cd "$FUZZ_DIR"
ctest --output-on-failure --parallel "$(nproc)" --timeout $((SECONDS_EACH + 120))
