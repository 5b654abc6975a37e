#!/usr/bin/env bash
# Installs what is needed, builds, and runs the main job on the model the repository ships
# (demo-code-target, a small trained Qwen3 code model). Until the HTTP server lands
# (`deepinfer serve`, issue 6) the main job is an offline batch through the engine: text
# prompts in, JSON results (text, token ids, finish reason, usage) out. Extra arguments go to
# `deepinfer generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
MODEL=tests/fixtures/models/demo-code-target
REQUESTS=build/start-requests.jsonl
RESULTS=build/start-results.jsonl
cat >"$REQUESTS" <<'JSONL'
{"id": "fibonacci", "prompt": "def fibonacci(n):", "max_tokens": 48, "temperature": 0}
{"id": "sorted", "prompt": "def sort_by_length(words):\n", "max_tokens": 48, "temperature": 0.7, "seed": 1}
{"id": "chat", "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 32, "temperature": 0}
JSONL
build/deepinfer generate "$MODEL" --input "$REQUESTS" --output "$RESULTS" "$@"
cat "$RESULTS"
