#!/usr/bin/env bash
# Builds the PyTorch package posenc (python/) into ./build and installs it into /usr/bin/python3's
# site-packages (/usr/local/lib/python3.11/dist-packages on Debian 12), so that `import posenc` works
# from any directory. Needs `scripts/deps.sh --tests` (libtorch-dev, pybind11-dev, python3-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPOSENC_BUILD_PYTHON=ON "$@" >/dev/null
ninja -C build posenc_python
site=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
sudo=""
if [[ $(id -u) -ne 0 ]] && ! { mkdir -p "$site" 2>/dev/null && [[ -w "$site" ]]; }; then sudo="sudo"; fi
$sudo cmake --install build --component python >/dev/null
(cd / && env -u PYTHONPATH /usr/bin/python3 -c 'import posenc; print("posenc", posenc.__version__, "->", posenc.__file__)')
