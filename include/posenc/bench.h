// posenc/bench.h — a tiny benchmark harness and the library of benchmark cases (`posenc bench`).
//
// NOTE: benchmarks are programs, never tests. Nothing in tests/ times anything; run these by hand on a
// quiet machine with a Release build (`posenc bench [--filter REGEX] [--threads N] [--json]`).
//
// Every case measures its baseline in the same run, interleaved with the kernel (baseline, kernel,
// baseline, kernel, …; medians): for elementwise kernels memcpy of the same bytes (threads split the
// copy like the kernel), for bias generation (write-only) memset of the output. Throughput is
// (bytes read + bytes written) / seconds in GB/s (10⁹ bytes) for both; ratio = kernel / baseline.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace posenc {

struct BenchRow {
  std::string kernel;    // "rope.forward.qk", "sinusoidal.forward", ...
  std::string encoding;  // registry name: "rope", "sinusoidal", ...
  std::string shape;     // "[1, 4096, 32, 128]"
  std::string dtype;     // "float32", "bfloat16", ...
  int threads = 1;
  double seconds = 0;              // median seconds of one call
  double throughput = 0;           // GB/s, (bytes read + written) / seconds
  std::string unit = "GB/s";
  std::string baseline;            // "memcpy" / "memset"
  double baseline_throughput = 0;  // GB/s of the baseline on the same bytes, same run
  double ratio = 0;                // throughput / baseline_throughput
};

// Median seconds of one call of fn: `warmup` untimed calls, then `repeats` samples, each of enough
// calls to last ≳ 10 ms.
double bench_median_seconds(const std::function<void()>& fn, int warmup = 1, int repeats = 5);

// Runs the default cases whose "kernel encoding shape dtype" line matches filter_regex (ECMAScript,
// searched; empty matches all), with `threads` threads (≤ 0: once with 1 thread and once with 2),
// calling on_row after each row. Returns all rows.
std::vector<BenchRow> run_benchmarks(const std::string& filter_regex, int threads,
                                     std::function<void(const BenchRow&)> on_row);

}  // namespace posenc
