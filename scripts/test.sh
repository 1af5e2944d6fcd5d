#!/usr/bin/env bash
# The test command: install what the tests need, build, install the PyTorch package posenc into
# /usr/bin/python3's site-packages, run every test (unit, CLI end-to-end, the articles' own code as an
# oracle, the Python package's); then the sanitizer suite: the same tests built with clang under
# ASan + UBSan, and 30 seconds of every fuzz target (scripts/sanitize.sh, docs/reliability.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --tests
# ccache: the packaging tests build the library again (as a shared library, as a subproject); with
# it they reuse the main build's objects. CMake reads these when it configures a new build folder.
export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
scripts/build.sh -DPOSENC_BUILD_TESTS=ON -DPOSENC_BUILD_PYTHON=ON
scripts/python.sh
ctest --test-dir build --output-on-failure -j2
scripts/sanitize.sh
