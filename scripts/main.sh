#!/usr/bin/env bash
# The main job: install, build, then run the study (a tiny language model trained per encoding at
# length 64 on the King James Bible, perplexity at 64 … 1024; table on stdout, files in study-out/),
# then the articles' four properties per encoding (posenc check, reading that study).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh -DPOSENC_BUILD_TESTS=OFF
build/posenc study --out study-out
build/posenc check --study study-out
