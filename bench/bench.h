#pragma once
// The harness behind `posenc bench`: every kernel timed against a baseline in the same rounds.
// Benchmarks are programs, never tests. What each row measures, its baseline and how a case is timed:
// docs/performance.md ("How a case is timed", "What the baselines measure").

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "posenc/status.h"
#include "posenc/view.h"

namespace posenc {

struct BenchRow {
  std::string kernel;    // "rope.forward.qk.half", "attention.forward", ...
  std::string encoding;  // registry name: "rope", "sinusoidal", ...
  std::string shape;     // "[1, 4096, 32, 128]" (attention: q's [B, L, H, d])
  std::string dtype;     // "float32", "bfloat16", ...
  int threads = 1;
  double seconds = 0;                   // median seconds of one call
  double throughput = 0;                // in `unit`
  std::string unit = "GB/s";            // "GB/s" or "GFLOP/s" (useful FLOPs)
  std::string baseline;                 // "memcpy" / "memset" / "sgemm"; "" for memory rows
  double baseline_throughput = 0;       // the baseline's rate in `unit`, same run
  double ratio = 0;                     // throughput / baseline_throughput
  std::string path;                     // attention: attention_path() (bench_cases.h), decode rows:
                                        // "decode" or "decode+vdpbf16"; "" otherwise
  std::optional<double> vs_nope;        // attention: seconds / nope_seconds
  std::optional<double> nope_seconds;   // attention: median seconds of nope timed beside it (nope: seconds)
  std::optional<double> one_thread_seconds;  // attention, threads > 1: the same call on one thread, beside it
  std::optional<double> speedup;             // attention, threads > 1: one_thread_seconds / seconds
  std::optional<double> baseline_speedup;    // attention, threads > 1: the same for the sgemm baseline
  int rounds = 1;  // whole runs combined (combine_rounds): the fields above are their medians
  double seconds_min = 0, seconds_max = 0, ratio_min = 0, ratio_max = 0;  // over the rounds
  std::optional<double> peak_extra_mb;  // memory rows: peak RSS − RSS before the call, MiB
  std::optional<double> io_mb;          // memory rows: inputs + outputs, MiB
};

// Median seconds of one call of fn: `warmup` untimed calls, then `repeats` samples, each of enough
// calls to last ≳ 10 ms.
double bench_median_seconds(const std::function<void()>& fn, int warmup = 1, int repeats = 5);

// Runs the default cases whose "kernel encoding shape dtype" line matches filter_regex (ECMAScript,
// searched; empty matches all), with `threads` threads (≤ 0: once with 1 thread and once with 2),
// calling on_row after each row and on_progress (if set) with a line before a case that takes long
// (calls of ≥ 1 s). Returns all rows.
std::vector<BenchRow> run_benchmarks(const std::string& filter_regex, int threads,
                                     std::function<void(const BenchRow&)> on_row,
                                     std::function<void(const std::string&)> on_progress = {});

// Rows of several whole runs (the same cases in the same order) as one: per row the median of each
// number over the rounds (seconds, rates, ratio, and the optional ones present in every round) and
// the min and max of seconds and ratio.
std::vector<BenchRow> combine_rounds(const std::vector<std::vector<BenchRow>>& rounds);

// The memory rows (attention at L, peak RSS above the inputs and outputs) whose line matches filter_regex, with `threads` threads (≤ 0: the
// default count, posenc::num_threads()), at L = length (the rows of the issue: 65536). Each case runs in a
// child process (fork); call this before the process has run any OpenMP parallel region (a forked child
// cannot reuse the parent's OpenMP threads). on_progress gets a line before each case and for each skipped
// encoding. Fails with kInternal when a child cannot be started or dies, kInvalidArgument when the attention
// refuses.
Expected<std::vector<BenchRow>> run_memory_benchmarks(
    const std::string& filter_regex, int threads, std::function<void(const BenchRow&)> on_row,
    std::function<void(const std::string&)> on_progress = {}, std::int64_t length = 65536,
    DType dtype = DType::kF32);

}  // namespace posenc
