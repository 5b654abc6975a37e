#!/usr/bin/env bash
# Installs the official API clients the end-to-end server tests drive (`openai`,
# `@anthropic-ai/sdk`), at the versions pinned by tests/server/clients/package-lock.json,
# into DIR/node_modules. Skipped when DIR already holds that exact lock file's install.
set -euo pipefail
DIR=${1:?usage: fetch_clients.sh DIR}
SOURCE="$(dirname "$0")/../tests/server/clients"
mkdir -p "$DIR"
if [[ -d "$DIR/node_modules" ]] && cmp -s "$SOURCE/package-lock.json" "$DIR/package-lock.json"; then
  exit 0
fi
cp "$SOURCE/package.json" "$SOURCE/package-lock.json" "$DIR/"
(cd "$DIR" && npm ci --no-audit --no-fund --silent)
