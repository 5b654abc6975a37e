#!/usr/bin/env bash
# Installs what is needed, builds, and starts the main job: `deepinfer serve` on the model the
# repository ships (demo-code-target, a small trained Qwen3 code model), on port 8000 unless
# DEEPINFER_PORT says otherwise. Extra arguments go to `deepinfer serve` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/deepinfer serve tests/fixtures/models/demo-code-target --kv-cache-bytes 1073741824 "$@"
