// posenc bench [--filter REGEX] [--threads N] [--repeat N] [--json] [--memory [--memory-length L]
// [--memory-dtype T]] — the benchmark cases of posenc/bench.h, each with its same-run baseline
// (memcpy / memset of the same bytes, sgemm for attention) and the ratio; --memory: the L = 65536
// attention peak-memory rows instead. A program, not a test. Progress lines for long cases go to stderr.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "bench/bench.h"

namespace posenc::cli {

namespace {

struct BenchState {
  std::string filter;
  std::string threads;
  bool json = false;
  bool memory = false;
  std::string memory_length, memory_dtype;
  std::string repeat;
  CLI::Option *filter_opt = nullptr, *memory_dtype_opt = nullptr;
};

nlohmann::ordered_json row_json(const BenchRow& r) {
  nlohmann::ordered_json j = {{"kernel", r.kernel},         {"encoding", r.encoding}, {"shape", r.shape},
                              {"dtype", r.dtype},           {"threads", r.threads},   {"seconds", r.seconds},
                              {"throughput", r.throughput}, {"unit", r.unit}};
  if (r.baseline.empty()) {
    j["baseline"] = nullptr;
    j["baseline_throughput"] = nullptr;
    j["ratio"] = nullptr;
  } else {
    j["baseline"] = r.baseline;
    j["baseline_throughput"] = r.baseline_throughput;
    j["ratio"] = r.ratio;
  }
  if (!r.path.empty()) j["path"] = r.path;
  if (r.vs_nope) j["vs_nope"] = *r.vs_nope;
  if (r.nope_seconds) j["nope_seconds"] = *r.nope_seconds;
  if (r.one_thread_seconds) j["one_thread_seconds"] = *r.one_thread_seconds;
  if (r.speedup) j["speedup"] = *r.speedup;
  if (r.baseline_speedup) j["baseline_speedup"] = *r.baseline_speedup;
  if (r.rounds > 1) {
    j["rounds"] = r.rounds;
    j["seconds_min"] = r.seconds_min;
    j["seconds_max"] = r.seconds_max;
    j["ratio_min"] = r.ratio_min;
    j["ratio_max"] = r.ratio_max;
  }
  if (r.peak_extra_mb) j["peak_extra_mb"] = *r.peak_extra_mb;
  if (r.io_mb) j["io_mb"] = *r.io_mb;
  return j;
}

void print_row(const BenchRow& r, bool json, bool memory) {
  if (json) {
    std::printf("%s\n", row_json(r).dump().c_str());
  } else if (memory) {
    std::printf("%-19s %-6s %-18s %-8s %3d %9.2f %9.2f %7.3f %9.1f %9.1f\n", r.kernel.c_str(),
                r.encoding.c_str(), r.shape.c_str(), r.dtype.c_str(), r.threads, r.seconds, r.throughput,
                r.vs_nope.value_or(0), r.io_mb.value_or(0), r.peak_extra_mb.value_or(0));
  } else {
    char vs[16] = "-", sp[32] = "";
    if (r.vs_nope) std::snprintf(vs, sizeof vs, "%.3f", *r.vs_nope);
    if (r.speedup) std::snprintf(sp, sizeof sp, "  %.2fx (base %.2fx)", *r.speedup, r.baseline_speedup.value_or(0));
    char rounds[96] = "";
    if (r.rounds > 1)
      std::snprintf(rounds, sizeof rounds, "  %d rounds: seconds %.3e-%.3e, ratio %.3f-%.3f", r.rounds, r.seconds_min,
                    r.seconds_max, r.ratio_min, r.ratio_max);
    std::printf("%-35s %-10s %-19s %-9s %3d %11.3e %9.2f %-7s %-7s %9.2f %6.3f %7s %s%s%s\n", r.kernel.c_str(),
                r.encoding.c_str(), r.shape.c_str(), r.dtype.c_str(), r.threads, r.seconds, r.throughput,
                r.unit.c_str(), r.baseline.c_str(), r.baseline_throughput, r.ratio, vs, r.path.c_str(), sp, rounds);
  }
  std::fflush(stdout);
}

void print_header(bool memory) {
  if (memory)
    std::printf("%-19s %-6s %-18s %-8s %3s %9s %9s %7s %9s %9s\n", "kernel", "enc", "shape", "dtype", "thr",
                "seconds", "GFLOP/s", "vs_nope", "io MiB", "extra MiB");
  else
    std::printf("%-35s %-10s %-19s %-9s %3s %11s %9s %-7s %-7s %9s %6s %7s %s\n", "kernel", "encoding", "shape",
                "dtype", "thr", "seconds", "rate", "unit", "base", "base rate", "ratio", "vs_nope",
                "path  speedup over 1 thread (threads > 1)");
}

void progress(const std::string& line) {
  std::fprintf(stderr, "posenc bench: %s\n", line.c_str());
  std::fflush(stderr);
}

void run_bench(const BenchState& st) {
  if (st.filter_opt->count() > 0 && st.filter.empty())  // an empty pattern would run every case
    fail(Status::Invalid("--filter",
                         "expected a regular expression, got an empty string (omit --filter for every case)"));
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
  std::int64_t length = 65536;
  if (!st.memory_length.empty()) {
    if (!st.memory) fail(Status::Invalid("--memory-length", "only with --memory"));
    length = parse_int("--memory-length", st.memory_length);
    if (length < 1 || length > (std::int64_t{1} << 22))
      fail(Status::Invalid("--memory-length", "expected 1 .. 4194304, got " + st.memory_length));
  }
  DType dtype = DType::kF32;
  if (st.memory_dtype_opt->count() > 0) {  // given, even as an empty string
    if (!st.memory) fail(Status::Invalid("--memory-dtype", "only with --memory"));
    if (st.memory_dtype == "bfloat16") dtype = DType::kBF16;
    else if (st.memory_dtype == "float16") dtype = DType::kF16;
    else if (st.memory_dtype != "float32")
      fail(Status::Invalid("--memory-dtype", "expected float32, bfloat16 or float16, got '" + st.memory_dtype + "'"));
  }
  int repeat = 1;
  if (!st.repeat.empty()) {
    if (st.memory) fail(Status::Invalid("--repeat", "not with --memory"));
    const std::int64_t n = parse_int("--repeat", st.repeat);
    if (n < 1 || n > 100) fail(Status::Invalid("--repeat", "expected 1 .. 100, got " + st.repeat));
    repeat = static_cast<int>(n);
  }
  bool header = st.json;  // the table's header comes with its first row (none when nothing ran)
  const auto on_row = [&](const BenchRow& r) {
    if (!header) print_header(st.memory);
    header = true;
    print_row(r, st.json, st.memory);
  };
  std::size_t n = 0;
  if (st.memory) {
    auto rows = run_memory_benchmarks(st.filter, threads, on_row, progress, length, dtype);
    if (!rows.ok()) fail(rows.status());
    n = rows->size();
  } else if (repeat == 1) {
    n = run_benchmarks(st.filter, threads, on_row, progress).size();
  } else {  // the rounds' rows as progress lines, then the table of their medians
    std::vector<std::vector<BenchRow>> rounds;
    for (int r = 0; r < repeat; ++r)
      rounds.push_back(run_benchmarks(
          st.filter, threads,
          [&](const BenchRow& b) {
            progress("round " + std::to_string(r + 1) + "/" + std::to_string(repeat) + ": " + b.kernel + " " +
                     b.encoding + " " + b.shape + " " + b.dtype + " threads " + std::to_string(b.threads) +
                     ": ratio " + std::to_string(b.ratio));
          },
          progress));
    const std::vector<BenchRow> rows = combine_rounds(rounds);
    for (const BenchRow& r : rows) on_row(r);
    n = rows.size();
  }
  if (n == 0) fail(Status::Invalid("--filter", "matched no benchmark case: '" + st.filter + "'"));
}

}  // namespace

Command add_bench_command(CLI::App& root) {
  auto st = std::make_shared<BenchState>();
  CLI::App* app = root.add_subcommand(
      "bench",
      "time the fast kernels against memcpy/memset of the same bytes, attention against sgemm "
      "(a program, never a test)");
  st->filter_opt = add_text(app, "--filter", &st->filter,
                            "run the cases whose 'kernel encoding shape dtype' matches REGEX", "REGEX");
  add_text(app, "--threads", &st->threads,
           "threads (default: each case with 1 and with 2; --memory: the default count)", "INT");
  app->add_flag("--json", st->json,
                "one JSON object per line: kernel, encoding, shape, dtype, threads, seconds, throughput, "
                "unit, baseline, baseline_throughput, ratio (attention also path, vs_nope, nope_seconds, and with more "
                "than one thread one_thread_seconds, speedup, baseline_speedup; --memory "
                "also peak_extra_mb, io_mb)")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  app->add_flag("--memory", st->memory,
                "instead: attention forward/backward at L = 65536, H = 8, d = 64, causal, per fused "
                "encoding, each in a child process reporting its peak RSS above its RSS before the call "
                "(minutes)")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  add_text(app, "--repeat", &st->repeat,
           "run the selected cases N times (whole runs) and print per row the median and the min-max of "
           "seconds and ratio over the rounds (default 1)",
           "INT");
  add_text(app, "--memory-length", &st->memory_length, "with --memory: L instead of 65536 (a quick look)",
           "INT");
  st->memory_dtype_opt =
      add_text(app, "--memory-dtype", &st->memory_dtype,
               "with --memory: q, k, v and the outputs in float32 (default), bfloat16 or float16", "TYPE");
  return {app, [st] { run_bench(*st); }};
}

}  // namespace posenc::cli
