#!/usr/bin/env bash
# Installs what is needed, builds, and runs the main job on the model the repository ships
# (demo-code-target, a small trained Qwen3 code model). Until the HTTP server lands
# (`deepinfer serve`, issue 6) the main job is generation from a prompt of token ids:
# "def fibonacci(n):\n" in that model's tokenizer. Extra arguments go to `deepinfer generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
MODEL=tests/fixtures/models/demo-code-target
exec build/deepinfer generate "$MODEL" --prompt-ids 327,289,519,266,998,1412,10,80,317,201 --max-tokens 32 "$@"
