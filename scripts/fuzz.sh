#!/usr/bin/env bash
# Runs one libFuzzer target of tests/fuzz under ASan + UBSan for SECONDS (docs/reliability.md):
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]     TARGET: npy, checkpoint, rope_config,
#                                                           positions, capi, cli
# It starts from the seed corpus tests/fuzz/corpus/TARGET (read only) and keeps what it finds in
# build-asan/fuzz/corpus-TARGET; a crash, leak, timeout or UB report stops it with a non-zero status
# and leaves the input in build-asan/fuzz/crash-TARGET-*. Add such an input to the seed corpus as
# regress-<what> once fixed. The last line printed holds the executions, cov and ft.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 2 ]]; then
  echo "usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]" >&2
  exit 2
fi
target=$1 seconds=$2
shift 2
seeds=tests/fuzz/corpus/$target
[[ -d $seeds ]] || { echo "fuzz.sh: TARGET: no seed corpus $seeds" >&2; exit 2; }
# POSENC_FUZZ_NO_BUILD=1 runs the binary as it is (while build-asan is being rebuilt for something else)
[[ -n ${POSENC_FUZZ_NO_BUILD:-} ]] || scripts/asan_build.sh "fuzz_$target" >/dev/null
work=build-asan/fuzz/corpus-$target
mkdir -p "$work"
dict=()
[[ -f tests/fuzz/$target.dict ]] && dict=("-dict=tests/fuzz/$target.dict")
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# -close_fd_mask=1: the CLI's --help texts would fill the log; reports go to stderr
set +e
"build-asan/fuzz/fuzz_$target" "$work" "$seeds" "${dict[@]}" -max_total_time="$seconds" -timeout=25 \
  -close_fd_mask=1 -print_final_stats=1 -artifact_prefix="build-asan/fuzz/crash-$target-" "$@" 2>&1 |
  grep -vE '^#[0-9]+\s+(NEW|REDUCE|pulse)'
status=${PIPESTATUS[0]}
exit "$status"
