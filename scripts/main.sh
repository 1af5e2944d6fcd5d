#!/usr/bin/env bash
# The main job: install, build, then run the tour (the catalogue and worked examples from the
# articles, all computed by the library).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh -DPOSENC_BUILD_TESTS=OFF
build/posenc tour
