// posenc/bench.h — a tiny benchmark harness and the library of benchmark cases (`posenc bench`).
//
// NOTE: benchmarks are programs, never tests. Nothing in tests/ times anything; run these by hand on a
// quiet machine with a Release build (`posenc bench [--filter REGEX] [--threads N] [--json]`).
//
// Every case measures its baseline in the same run, interleaved with the kernel (one warm-up call of
// each, then rounds of baseline sample, kernel sample; medians of the samples; a sample is enough
// calls to last ≳ 10 ms; at least 5 rounds, more (up to 9) while a case stays under ~0.5 s; a call
// of ≥ 1 s is its own warm-up and gets 3 rounds, so the slowest cases cost 3 calls).
// ratio = throughput / baseline_throughput.
//
// Elementwise kernels (unit GB/s = 10⁹ bytes/s): bytes = every byte read + every byte written, counted
// from the tensors' sizes (RoPE q+k: q, k read and written; learned add: x and the table read, y
// written; in place counts the read and the write of the same tensor). Baseline: memcpy of half those
// bytes (so the copy too reads and writes exactly the kernel's byte count), threads splitting the copy
// like the kernel. Bias generation is write-only: baseline memset of the output.
//
// Decode (kernel attention.decode, unit GB/s): a decode step through the public
// posenc::attention_forward, M = 1 query at the end of N keys (32768 and 131072), q [1, 1, Hq, D],
// k and v [1, N, Hkv, D] float32, bfloat16 or float16 (shape column "[1, N, Hkv, D]/Hq"); nope,
// rope (keys_rotated: a cache of rotated keys), alibi, t5, kerple, sandwich, fire. bytes = the K and V
// bytes; baseline "sum": a sum of every 8-byte word of the same two buffers, split over the threads
// (what reading K and V once costs), so ratio = baseline seconds / kernel seconds.
//
// Whole runs: `posenc bench --repeat N` runs the selected cases N times and prints one table of
// per-row medians with the min–max of seconds and ratio over the rounds (combine_rounds).
//
// Attention (unit GFLOP/s = 10⁹ useful FLOP/s): through the public posenc::attention_forward /
// attention_backward, causal, B = 1, Hq = Hkv = 8, d = 64, every encoding the attention takes (the
// registry's kinds other than absolute), with each encoding's default parameters and random tensors
// (t5: 32 buckets; xl: R = 64; cope: npos = 64; rope2d axial on a W × W grid of positions, W = ⌈√L⌉;
// mrope with Qwen2-VL's section proportions 8,12,12 on a text + image + text sequence's ids; xpos
// with scale base 512); rope2d mixed (its learned frequencies, dfreqs in the backward) as kernels
// attention.forward.mixed / attention.backward.mixed at L = 4096 float32. Useful FLOPs of the forward: 4·B·H·M·N·d (the two
// products q·kᵀ and P·v), halved when causal. The backward is counted as 2.5× that, as
// FlashAttention reports it (five products of that size: q·kᵀ recomputed, dO·vᵀ, Pᵀ·dO, dSᵀ·q,
// dS·k); its seconds are the whole public call, which computes dq, dk, dv and every parameter
// gradient the encoding has, and first recomputes the forward's out and lse (work not counted).
// Baseline "sgemm": the unfused attention's two products per head with OpenBLAS cblas_sgemm at the
// row's thread count (S = q·kᵀ [L, L] over d, then S·v; float32 beside the bfloat16 rows too), its
// throughput = its real FLOPs (4·H·L·L·d, not halved) / seconds. So ratio is the share of a dense
// sgemm's rate that the kernel turns into useful work. `path` says whether the fused kernel or the
// plain reference (posenc::reference, double, one thread) ran; `vs_nope` = seconds / seconds of nope
// for the same kernel (attention.forward / attention.backward: a variant suffix such as ".mixed" is
// compared with the plain kernel's nope), shape, dtype and threads, nope timed in the same rounds as
// the encoding (baseline, kernel, nope, repeated; medians), so that the machine's drift between
// cases does not enter the ratio; 1 for nope itself. Rows of more than one thread also time the
// same call and the baseline on one thread in those rounds: one_thread_seconds, speedup =
// one_thread_seconds / seconds (the two-thread aim: ≥ 1.8) and baseline_speedup, the sgemm
// baseline's own (what the machine's second core gives a dense product in the same minutes). In those
// rows each kernel sample starts 0.15 s after the baseline's, when OpenBLAS's worker threads, which
// spin for ~0.1 s after a call, have gone to sleep (bench.cc, kBlasSettle).
//
// Memory rows (run_memory_benchmarks, `posenc bench --memory [--memory-length L] [--memory-dtype T]`;
// not in the default run: minutes): attention forward and backward at L = 65536 (H = 8, d = 64,
// causal; q, k, v and the outputs float32, or bfloat16 / float16 with `dtype`) per encoding, one
// call each (seconds and useful GFLOP/s of that call, no baseline), each in a forked child process
// that allocates and touches its inputs and outputs, resets its peak RSS
// (/proc/self/clear_refs), runs the call and reports VmHWM minus its RSS just before the call
// (peak_extra_mb, MiB; one-time lazy initialisation inside the call, such as OpenBLAS buffers, counts),
// with io_mb = the inputs' and outputs' bytes (forward q, k, v, out; backward q, k, v, dout, dq, dk,
// dv). The bound: peak_extra_mb < 64. Encodings whose attention is not fused are skipped there
// (the reference holds double copies of every [L, H, d] tensor and would run for hours).
#pragma once

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
  std::string unit = "GB/s";            // "GB/s" or "GFLOP/s" (useful FLOPs, see above)
  std::string baseline;                 // "memcpy" / "memset" / "sgemm"; "" for memory rows
  double baseline_throughput = 0;       // the baseline's rate in `unit`, same run
  double ratio = 0;                     // throughput / baseline_throughput
  std::string path;                     // attention: "fused" or "reference"; "" otherwise
  std::optional<double> vs_nope;        // attention: seconds / nope_seconds (see above)
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

// The memory rows (see above) whose line matches filter_regex, with `threads` threads (≤ 0: the
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
