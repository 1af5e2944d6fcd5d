#!/usr/bin/env bash
# The test command: install what the tests need, build, run every test (unit, CLI end-to-end, and the
# articles' own code as an oracle).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --tests
scripts/build.sh -DPOSENC_BUILD_TESTS=ON
ctest --test-dir build --output-on-failure -j2
