// The memory rows of `posenc bench --memory`: one attention call per encoding in a forked child that
// reports its peak RSS above its RSS before the call.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <regex>

#include "bench/bench.h"
#include "bench/bench_cases.h"
#include "posenc/threads.h"

namespace posenc {
namespace {

using namespace bench_impl;  // NOLINT: the cases' problems

// A field of /proc/self/status in kB ("VmRSS", "VmHWM"); −1 if unreadable.
double proc_status_kb(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  double kb = -1;
  const std::size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') {
      kb = std::strtod(line + n + 1, nullptr);
      break;
    }
  std::fclose(f);
  return kb;
}

// Resets VmHWM to the current RSS (Linux ≥ 4.0); false where not possible.
bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

struct MemoryResult {  // what a child writes to its pipe
  int ok = 0;
  double seconds = 0, peak_extra_mb = 0, io_mb = 0;
  char message[512] = {};
};

// In the child: one call, its time and its peak RSS above the RSS just before it.
MemoryResult memory_child(Encoding enc, I L, DType dtype, bool backward, int threads) {
  MemoryResult r;
  set_num_threads(threads);
  auto a = make_attention(enc, L, dtype, backward, threads);
  r.io_mb = a->io_bytes / (1024.0 * 1024.0);
  const bool reset = reset_peak_rss();
  const double before = proc_status_kb("VmRSS");
  const double t0 = now();
  const Status st = run_attention(*a, backward);
  r.seconds = now() - t0;
  const double peak = proc_status_kb("VmHWM");
  if (!st.ok()) {
    std::snprintf(r.message, sizeof r.message, "%s", st.message().c_str());
    return r;
  }
  if (!reset || before < 0 || peak < 0) {
    std::snprintf(r.message, sizeof r.message, "cannot read the peak RSS (/proc/self/clear_refs, VmHWM)");
    return r;
  }
  r.peak_extra_mb = std::max(0.0, peak - before) / 1024.0;
  r.ok = 1;
  return r;
}

Expected<MemoryResult> run_in_child(Encoding enc, I L, DType dtype, bool backward, int threads) {
  int fds[2];
  if (pipe(fds) != 0) return Status::Internal(std::string("pipe: ") + std::strerror(errno));
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return Status::Internal(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    close(fds[0]);
    const MemoryResult r = memory_child(enc, L, dtype, backward, threads);
    const char* p = reinterpret_cast<const char*>(&r);
    std::size_t left = sizeof r;
    while (left > 0) {
      const ssize_t w = write(fds[1], p, left);
      if (w <= 0) break;
      p += w;
      left -= static_cast<std::size_t>(w);
    }
    _exit(left == 0 ? 0 : 1);
  }
  close(fds[1]);
  MemoryResult r;
  char* p = reinterpret_cast<char*>(&r);
  std::size_t got = 0;
  while (got < sizeof r) {
    const ssize_t n = read(fds[0], p + got, sizeof r - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  close(fds[0]);
  int wst = 0;
  while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
  }
  if (got != sizeof r || !WIFEXITED(wst) || WEXITSTATUS(wst) != 0)
    return Status::Internal(WIFSIGNALED(wst) ? "the benchmark child was killed by signal " +
                                                   std::to_string(WTERMSIG(wst)) + " (out of memory?)"
                                             : std::string("the benchmark child failed"));
  return r;
}

}  // namespace

Expected<std::vector<BenchRow>> run_memory_benchmarks(const std::string& filter_regex, int threads,
                                                      std::function<void(const BenchRow&)> on_row,
                                                      std::function<void(const std::string&)> on_progress,
                                                      std::int64_t length, DType dtype) {
  if (length < 1) return Status::Invalid("length", "expected ≥ 1, got " + std::to_string(length));
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16)
    return Status::Invalid("dtype", std::string("expected float32, bfloat16 or float16, got ") + dtype_name(dtype));
  const std::regex re(filter_regex.empty() ? std::string(".*") : filter_regex);
  const int t = threads > 0 ? threads : num_threads();
  const std::string shape = shape_str({1, length, kHeads, kHeadDim});
  std::vector<BenchRow> rows;
  std::map<std::string, double> nope;
  for (bool backward : {false, true})
    for (const EncodingInfo* e : attention_encodings()) {
      const std::string kernel = backward ? "attention.backward" : "attention.forward";
      const std::string line = kernel + " " + e->name + " " + shape + " " + dtype_name(dtype);
      if (!std::regex_search(line, re)) continue;
      const std::string path = attention_path(e->id, dtype);
      if (path.rfind("fused", 0) != 0) {
        if (on_progress)
          on_progress(line + ": skipped, " + e->name +
                      "'s attention is not fused (the reference would run for hours)");
        continue;
      }
      if (on_progress) on_progress(line + " threads " + std::to_string(t) + ": running in a child process");
      Expected<MemoryResult> m = run_in_child(e->id, length, dtype, backward, t);
      if (!m.ok()) return m.status();
      if (!m->ok) return Status::Invalid("memory", line + ": " + m->message);
      BenchRow r;
      r.kernel = kernel;
      r.encoding = e->name;
      r.shape = shape;
      r.dtype = dtype_name(dtype);
      r.threads = t;
      r.seconds = m->seconds;
      r.unit = "GFLOP/s";
      r.throughput = attention_flops(length, backward) / r.seconds / 1e9;
      r.path = path;
      r.peak_extra_mb = m->peak_extra_mb;
      r.io_mb = m->io_mb;
      if (e->id == Encoding::kNope) nope[kernel] = r.seconds;
      if (nope.count(kernel)) r.vs_nope = r.seconds / nope[kernel];
      rows.push_back(r);
      if (on_row) on_row(r);
    }
  return rows;
}

}  // namespace posenc
