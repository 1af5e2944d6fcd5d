// posenc bench [--filter REGEX] [--threads N] [--json] — the benchmark cases of posenc/bench.h, each
// with its same-run baseline (memcpy / memset of the same bytes) and the ratio. A program, not a test.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli/cli_common.h"
#include "posenc/bench.h"

namespace posenc::cli {

namespace {

struct BenchState {
  std::string filter;
  std::string threads;
  bool json = false;
};

void run_bench(const BenchState& st) {
  try {
    std::regex check(st.filter);
  } catch (const std::regex_error& e) {
    fail(Status::Invalid("--filter", "expected an ECMAScript regular expression, got '" + st.filter + "'"));
  }
  int threads = 0;
  if (!st.threads.empty()) {
    const std::int64_t t = parse_int("--threads", st.threads);
    if (t < 1 || t > 1024) fail(Status::Invalid("--threads", "expected 1 .. 1024, got " + st.threads));
    threads = static_cast<int>(t);
  }
  if (!st.json)
    std::printf("%-34s %-10s %-19s %-9s %3s %11s %9s %-7s %9s %6s\n", "kernel", "encoding", "shape", "dtype",
                "thr", "seconds", "GB/s", "base", "base GB/s", "ratio");
  const auto rows = run_benchmarks(st.filter, threads, [&](const BenchRow& r) {
    if (st.json) {
      const nlohmann::json j = {{"kernel", r.kernel},       {"encoding", r.encoding},
                                {"shape", r.shape},         {"dtype", r.dtype},
                                {"threads", r.threads},     {"seconds", r.seconds},
                                {"throughput", r.throughput}, {"unit", r.unit},
                                {"baseline", r.baseline},   {"baseline_throughput", r.baseline_throughput},
                                {"ratio", r.ratio}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-34s %-10s %-19s %-9s %3d %11.3e %9.2f %-7s %9.2f %6.3f\n", r.kernel.c_str(),
                  r.encoding.c_str(), r.shape.c_str(), r.dtype.c_str(), r.threads, r.seconds, r.throughput,
                  r.baseline.c_str(), r.baseline_throughput, r.ratio);
    }
    std::fflush(stdout);
  });
  if (rows.empty()) fail(Status::Invalid("--filter", "matched no benchmark case: '" + st.filter + "'"));
}

}  // namespace

Command add_bench_command(CLI::App& root) {
  auto st = std::make_shared<BenchState>();
  CLI::App* app = root.add_subcommand(
      "bench", "time the fast kernels against memcpy/memset of the same bytes (a program, never a test)");
  add_text(app, "--filter", &st->filter, "run the cases whose 'kernel encoding shape dtype' matches REGEX",
           "REGEX");
  add_text(app, "--threads", &st->threads, "threads (default: each case with 1 and with 2)", "INT");
  app->add_flag("--json", st->json,
                "one JSON object per line: kernel, encoding, shape, dtype, threads, seconds, throughput, "
                "unit, baseline, baseline_throughput, ratio");
  return {app, [st] { run_bench(*st); }};
}

}  // namespace posenc::cli
