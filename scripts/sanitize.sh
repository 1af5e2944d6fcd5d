#!/usr/bin/env bash
# The sanitizer suite (docs/reliability.md): builds ./build-asan (clang, ASan + UBSan, scripts/asan_build.sh),
# runs the unit, end-to-end and C ABI tests there with any report fatal, then every fuzz target for
# FUZZ_SECONDS (default 30) each. python.* (an ASan-built extension needs LD_PRELOAD into the
# interpreter) and package.* (they build and install their own uninstrumented copies) run in the
# normal suite only.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/asan_build.sh
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
ctest --test-dir build-asan --output-on-failure -j2 -E '^(python|package)\.'
mkdir -p build-asan/fuzz
for t in npy checkpoint rope_config positions capi cli; do
  log=build-asan/fuzz/smoke-$t.log
  if ! scripts/fuzz.sh "$t" "${FUZZ_SECONDS:-30}" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "sanitize.sh: fuzz target $t failed (input: build-asan/fuzz/crash-$t-*)" >&2
    exit 1
  fi
  echo "fuzz $t: $(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)"
done
