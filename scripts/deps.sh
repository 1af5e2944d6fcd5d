#!/usr/bin/env bash
# Installs what posenc needs from Debian 12's packages. Idempotent: installs only what is missing.
#   scripts/deps.sh            build + run dependencies
#   scripts/deps.sh --tests    plus what the tests use (GoogleTest; numpy and torch as test oracles),
#                              the PyTorch package's build (libtorch-dev, pybind11-dev, python3-dev)
#                              and the sanitizer suite's (clang, libclang-rt-14-dev, libomp-14-dev);
#                              ccache, which scripts/test.sh uses for the packaging tests' rebuilds
set -euo pipefail

# bible-kjv: the study's built-in corpus; gnuplot-nox: its plots and `posenc plot`.
pkgs=(g++ cmake ninja-build pkg-config libcli11-dev nlohmann-json3-dev libhwy-dev libopenblas-dev
      bible-kjv gnuplot-nox)
if [[ "${1:-}" == "--tests" ]]; then
  pkgs+=(libgtest-dev python3 python3-numpy python3-torch libtorch-dev pybind11-dev python3-dev python3-pytest)
  # the sanitizer suite and the fuzz targets (scripts/sanitize.sh): clang, libFuzzer, ASan, UBSan, libomp
  pkgs+=(clang libclang-rt-14-dev libomp-14-dev ccache)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "posenc: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
