// The harness of `posenc bench` (bench.h): the case list, the interleaved timing, the rows.
#include "bench/bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <regex>
#include <thread>
#include <vector>

#include "bench/bench_cases.h"
#include "posenc/threads.h"

namespace posenc {
namespace {

using namespace bench_impl;  // NOLINT: the cases

std::vector<Case> default_cases() {
  std::vector<Case> cs = elementwise_cases();
  for (auto* more : {&attention_cases, &decode_cases})
    for (Case& c : (*more)()) cs.push_back(std::move(c));
  return cs;
}

std::string case_line(const Case& c) {
  return c.kernel + " " + c.encoding + " " + c.shape + " " + dtype_name(c.dtype);
}

// ---- timing -----------------------------------------------------------------------------------------

constexpr double kSampleSeconds = 0.01;  // a sample lasts at least this long
constexpr double kCaseSeconds = 0.5;     // more rounds while a case stays under this
constexpr double kSlowCall = 1.0;        // a call this long is its own warm-up
// At least 5 rounds. A median of 3 is decided by two slow rounds, and a two-thread attention row at
// L = 4096 takes ~1.5–2 s a round (sgemm, the wait below, the kernel and nope on two threads, then
// the kernel and sgemm on one: `nope` forward's five rounds and warm-up took 8.6 s, backward 12.2 s),
// so a few seconds of load on the shared second vCPU could decide it: each full run with 3 rounds
// that the README quotes (the sixth to the fifteenth) had one to nine of its 26 such rows under 1.8×,
// mostly where sgemm's own speed-up dipped in the same rounds. A call of ≥ kSlowCall keeps 3 rounds.
constexpr int kMinRounds = 5, kSlowRounds = 3, kMaxRounds = 9;
// After a multi-thread sgemm sample, OpenBLAS's pthread workers keep spinning for 2^28 TSC cycles
// (its THREAD_TIMEOUT default; ~0.1 s at this machine's 2.6 GHz TSC) before they sleep, and a
// kernel timed then shares a core with them. Seen as the first two-thread attention row of a run
// (nope forward, L = 1024) at 0.76–1.10× one thread in nine of ten runs of `posenc bench --filter
// 'attention.(forward|backward) (nope|fire) .*1024' --threads 2` (and at 0.75× and 1.10× in two of
// four full runs), against 1.94–2.12× in six runs with OPENBLAS_THREAD_TIMEOUT=4 and 1.89–2.26× in
// eight with this wait. So the kernel's sample starts this long after the baseline's, as a call
// outside a benchmark would find the workers.
constexpr double kBlasSettle = 0.15;

double time_calls(const std::function<void()>& fn, int calls) {
  const double a = now();
  for (int i = 0; i < calls; ++i) fn();
  return (now() - a) / calls;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  double kernel, baseline;
  std::vector<double> others;  // medians of the other functions, in their order
};

// Baseline, kernel and the other functions (nope beside an encoding; the one-thread kernel and
// baseline beside a row of more threads) interleaved, round by round, so that all see the same
// machine state (docs/performance.md, "How a case is timed").
// settle: seconds to wait after each baseline sample before the kernel's (see kBlasSettle).
Timing measure(const std::function<void()>& kernel, const std::function<void()>& baseline,
               const std::function<void(double)>& on_slow,
               const std::vector<std::function<void()>>& others = {}, double settle = 0) {
  const auto pause = [settle] {
    if (settle > 0) std::this_thread::sleep_for(std::chrono::duration<double>(settle));
  };
  const double wb = time_calls(baseline, 1);
  pause();
  const double wk = time_calls(kernel, 1);
  std::vector<double> wo;
  for (const auto& f : others) wo.push_back(time_calls(f, 1));
  if (wk >= kSlowCall && on_slow) on_slow(wk);
  auto calls = [](double once) { return std::max(1, static_cast<int>(std::ceil(kSampleSeconds / std::max(once, 1e-9)))); };
  const int ib = calls(wb), ik = calls(wk);
  std::vector<int> io;
  double round = ib * wb + ik * wk;
  for (double w : wo) {
    io.push_back(calls(w));
    round += io.back() * w;
  }
  int rounds = wk >= kSlowCall ? kSlowRounds
                                : std::clamp(static_cast<int>(kCaseSeconds / round), kMinRounds, kMaxRounds);
  rounds |= 1;  // odd: the median is one sample
  std::vector<double> bs, ks;
  std::vector<std::vector<double>> os(others.size());
  if (wk >= kSlowCall) {  // the warm-up call is a sample; the baseline gets a sample of its own
    bs.push_back(time_calls(baseline, ib));
    pause();  // before the others (nope on the same threads)
    ks.push_back(wk);
    for (std::size_t o = 0; o < others.size(); ++o)
      os[o].push_back(wo[o] >= kSlowCall ? wo[o] : time_calls(others[o], io[o]));
  }
  while (static_cast<int>(ks.size()) < rounds) {
    bs.push_back(time_calls(baseline, ib));
    pause();
    ks.push_back(time_calls(kernel, ik));
    for (std::size_t o = 0; o < others.size(); ++o) os[o].push_back(time_calls(others[o], io[o]));
  }
  Timing t{median(ks), median(bs), {}};
  for (const auto& v : os) t.others.push_back(median(v));
  return t;
}

char fmt_buf[64];
const char* fmt(double x) {
  std::snprintf(fmt_buf, sizeof fmt_buf, "%.3g", x);
  return fmt_buf;
}

}  // namespace

double bench_median_seconds(const std::function<void()>& fn, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) fn();
  const double once = std::max(time_calls(fn, 1), 1e-9);
  const int iters = std::max(1, static_cast<int>(std::ceil(kSampleSeconds / once)));
  std::vector<double> samples;
  for (int r = 0; r < std::max(1, repeats); ++r) samples.push_back(time_calls(fn, iters));
  return median(samples);
}

std::vector<BenchRow> run_benchmarks(const std::string& filter_regex, int threads,
                                     std::function<void(const BenchRow&)> on_row,
                                     std::function<void(const std::string&)> on_progress) {
  const std::regex re(filter_regex.empty() ? std::string(".*") : filter_regex);
  const std::vector<int> counts = threads > 0 ? std::vector<int>{threads} : std::vector<int>{1, 2};
  const int saved = num_threads();
  std::vector<BenchRow> rows;
  for (const Case& c : default_cases()) {
    const std::string line = case_line(c);
    if (!std::regex_search(line, re)) continue;
    for (int t : counts) {
      set_num_threads(t);
      const Bound b = c.setup(t);
      const Bound nb = c.nope_setup ? c.nope_setup(t) : Bound{};
      // attention with more than one thread: the kernel and the baseline on one thread beside it
      const bool attention = c.kernel.rfind("attention.", 0) == 0 && c.path.rfind("decode", 0) != 0;
      const Bound b1 = attention && t > 1 ? c.setup(1) : Bound{};
      const auto on_one = [&](const std::function<void()>& f) {
        return [&, f] {
          set_num_threads(1);
          f();
          set_num_threads(t);
        };
      };
      std::vector<std::function<void()>> others;
      if (nb.kernel) others.push_back(nb.kernel);
      if (b1.kernel) {
        others.push_back(on_one(b1.kernel));
        others.push_back(on_one(b1.baseline));
      }
      const Timing tm = measure(
          b.kernel, b.baseline,
          [&](double once) {
            if (on_progress)
              on_progress(line + " threads " + std::to_string(t) + (c.path.empty() ? "" : " (" + c.path + ")") +
                          ": " + fmt(once) + " s a call, 3 calls" + (nb.kernel ? ", nope beside it" : "") +
                          (b1.kernel ? ", one thread beside it" : ""));
          },
          others, attention && t > 1 ? kBlasSettle : 0.0);
      BenchRow r;
      r.kernel = c.kernel;
      r.encoding = c.encoding;
      r.shape = c.shape;
      r.dtype = dtype_name(c.dtype);
      r.threads = t;
      r.seconds = tm.kernel;
      r.unit = c.unit;
      r.throughput = b.kernel_work / r.seconds / 1e9;
      r.baseline = b.baseline_name;
      r.baseline_throughput = b.baseline_work / tm.baseline / 1e9;
      r.ratio = r.throughput / r.baseline_throughput;
      r.path = c.path;
      if (attention) {
        r.nope_seconds = nb.kernel ? tm.others[0] : tm.kernel;
        r.vs_nope = r.seconds / *r.nope_seconds;
        if (b1.kernel) {
          const std::size_t o = nb.kernel ? 1 : 0;
          r.one_thread_seconds = tm.others[o];
          r.speedup = tm.others[o] / r.seconds;
          r.baseline_speedup = tm.others[o + 1] / tm.baseline;
        }
      }
      rows.push_back(r);
      if (on_row) on_row(r);
    }
  }
  set_num_threads(saved == omp_get_max_threads() ? 0 : saved);
  return rows;
}

std::vector<BenchRow> combine_rounds(const std::vector<std::vector<BenchRow>>& rounds) {
  std::vector<BenchRow> out;
  if (rounds.empty()) return out;
  for (std::size_t i = 0; i < rounds[0].size(); ++i) {
    std::vector<double> sec, thr, bthr, ratio;
    for (const auto& r : rounds) {
      sec.push_back(r[i].seconds);
      thr.push_back(r[i].throughput);
      bthr.push_back(r[i].baseline_throughput);
      ratio.push_back(r[i].ratio);
    }
    BenchRow row = rounds[0][i];
    row.rounds = static_cast<int>(rounds.size());
    row.seconds = median(sec);
    row.throughput = median(thr);
    row.baseline_throughput = median(bthr);
    row.ratio = median(ratio);
    row.seconds_min = *std::min_element(sec.begin(), sec.end());
    row.seconds_max = *std::max_element(sec.begin(), sec.end());
    row.ratio_min = *std::min_element(ratio.begin(), ratio.end());
    row.ratio_max = *std::max_element(ratio.begin(), ratio.end());
    auto med = [&](std::optional<double> BenchRow::*f) {
      std::vector<double> v;
      for (const auto& r : rounds)
        if (r[i].*f) v.push_back(*(r[i].*f));
      if (v.size() == rounds.size()) row.*f = median(v);
    };
    med(&BenchRow::vs_nope);
    med(&BenchRow::nope_seconds);
    med(&BenchRow::one_thread_seconds);
    med(&BenchRow::speedup);
    med(&BenchRow::baseline_speedup);
    out.push_back(row);
  }
  return out;
}

}  // namespace posenc
