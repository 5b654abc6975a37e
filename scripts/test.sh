#!/usr/bin/env bash
# Installs, builds and runs the whole test suite (what CI runs): every unit, parity and server
# test, then each fuzz target for DEEPINFER_FUZZ_SECONDS (20 by default; 0 skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure --parallel "$(nproc)" --timeout 900)
if [[ ${DEEPINFER_FUZZ_SECONDS:-20} != 0 ]]; then
  scripts/fuzz.sh
fi
