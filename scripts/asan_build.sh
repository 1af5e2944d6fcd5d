#!/usr/bin/env bash
# Configures and builds ./build-asan: clang, every target under ASan + UBSan (-O1), the tests and the
# libFuzzer targets of tests/fuzz (docs/reliability.md). Incremental; safe to run again.
#   scripts/asan_build.sh [NINJA TARGET...]    (no target: everything)
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
      -DCMAKE_CXX_COMPILER=clang++ -DPOSENC_BUILD_TESTS=ON -DPOSENC_SANITIZE=address,undefined \
      -DPOSENC_BUILD_FUZZ=ON >/dev/null
ninja -C build-asan "$@"
