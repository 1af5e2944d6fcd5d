#!/usr/bin/env bash
# Configures and builds posenc into ./build (incremental; safe to run again).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C build
