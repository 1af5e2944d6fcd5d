// The benchmark cases of `posenc bench` (see posenc/bench.h: programs, never tests).
#include "posenc/bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <regex>
#include <vector>

#include "posenc/absolute.h"
#include "posenc/bias.h"
#include "posenc/rope.h"
#include "posenc/threads.h"
#include "posenc/view.h"

namespace posenc {
namespace {

using Clock = std::chrono::steady_clock;

double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// A 64-byte aligned, first-touched buffer (first touch by the threads that will use it).
struct Mem {
  std::unique_ptr<unsigned char[], void (*)(void*)> p{nullptr, std::free};
  std::size_t bytes = 0;
  explicit Mem(std::size_t n, int threads, unsigned char fill = 0) : bytes(n) {
    p.reset(static_cast<unsigned char*>(std::aligned_alloc(64, (n + 63) / 64 * 64)));
    const std::int64_t chunks = 64;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::size_t a = n * static_cast<std::size_t>(c) / chunks, b = n * static_cast<std::size_t>(c + 1) / chunks;
      std::memset(p.get() + a, fill, b - a);
    }
  }
  void* data() const { return p.get(); }
};

// Baselines, split over threads like the kernels.
void par_memcpy(void* dst, const void* src, std::size_t n, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num()), T = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t a = n * t / T / 64 * 64, b = t + 1 == T ? n : n * (t + 1) / T / 64 * 64;
    std::memcpy(static_cast<char*>(dst) + a, static_cast<const char*>(src) + a, b - a);
  }
}
void par_memset(void* dst, std::size_t n, int threads) {
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num()), T = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t a = n * t / T / 64 * 64, b = t + 1 == T ? n : n * (t + 1) / T / 64 * 64;
    std::memset(static_cast<char*>(dst) + a, 0, b - a);
  }
}

struct Case {
  std::string kernel, encoding, shape;
  DType dtype;
  // Builds buffers for `threads` and returns (kernel, baseline, kernel bytes, baseline bytes, baseline name).
  std::function<void(int threads, std::function<void()>* k, std::function<void()>* b, double* kbytes,
                     double* bbytes, std::string* bname, std::shared_ptr<void>* keep)>
      setup;
};

void fill_random(void* p, std::size_t n_elems, DType dt) {
  const View v = View::contiguous(p, dt, {static_cast<std::int64_t>(n_elems)});
  std::uint32_t s = 12345;
  // Only a strided sample is randomised (setting every element through View would dominate the run).
  for (std::size_t i = 0; i < n_elems; i += 61) {
    s = s * 1664525u + 1013904223u;
    v.set(static_cast<std::int64_t>(i), (static_cast<double>(s >> 8) / 16777216.0) - 0.5);
  }
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  return View::contiguous(nullptr, DType::kF32, s).shape_str();
}

Case rope_case(const std::string& kernel, std::vector<std::int64_t> shape, DType dt, RopeLayout layout,
               bool in_place, bool backward) {
  Case c{kernel + "." + rope_layout_name(layout) + (in_place ? ".inplace" : ""), "rope", shape_str(shape), dt, {}};
  c.setup = [=](int threads, std::function<void()>* k, std::function<void()>* b, double* kb, double* bb,
                std::string* bn, std::shared_ptr<void>* keep) {
    std::int64_t n = 1;
    for (std::int64_t s : shape) n *= s;
    const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dt);
    auto q = std::make_shared<Mem>(bytes, threads), kk = std::make_shared<Mem>(bytes, threads);
    auto qo = std::make_shared<Mem>(bytes, threads), ko = std::make_shared<Mem>(bytes, threads);
    fill_random(q->data(), static_cast<std::size_t>(n), dt);
    fill_random(kk->data(), static_cast<std::size_t>(n), dt);
    RopeParams p;
    p.layout = layout;
    const View qv = View::contiguous(q->data(), dt, shape), kv = View::contiguous(kk->data(), dt, shape);
    const View qov = in_place ? qv : View::contiguous(qo->data(), dt, shape);
    const View kov = in_place ? kv : View::contiguous(ko->data(), dt, shape);
    Positions pos;
    pos.offset = shape[1] == 1 ? 4095 : 0;  // a decode step sits at the end of the context
    *k = [=] { (void)rope_apply_qk(p, qv, kv, pos, qov, kov, backward); };
    *b = [=] {
      par_memcpy(qo->data(), q->data(), bytes, threads);
      par_memcpy(ko->data(), kk->data(), bytes, threads);
    };
    *kb = *bb = 4.0 * static_cast<double>(bytes);
    *bn = "memcpy";
    *keep = std::make_shared<std::vector<std::shared_ptr<Mem>>>(std::vector<std::shared_ptr<Mem>>{q, kk, qo, ko});
  };
  return c;
}

Case absolute_case(const std::string& enc, std::vector<std::int64_t> shape, DType dt, bool in_place) {
  Case c{enc + ".forward" + (in_place ? ".inplace" : ""), enc, shape_str(shape), dt, {}};
  c.setup = [=](int threads, std::function<void()>* k, std::function<void()>* b, double* kb, double* bb,
                std::string* bn, std::shared_ptr<void>* keep) {
    const std::int64_t n = shape[0] * shape[1] * shape[2];
    const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dt);
    auto x = std::make_shared<Mem>(bytes, threads), y = std::make_shared<Mem>(bytes, threads);
    fill_random(x->data(), static_cast<std::size_t>(n), dt);
    const View xv = View::contiguous(x->data(), dt, shape);
    const View yv = in_place ? xv : View::contiguous(y->data(), dt, shape);
    std::shared_ptr<Mem> table;
    *bb = 2.0 * static_cast<double>(bytes);
    if (enc == "learned") {
      const std::size_t tbytes = static_cast<std::size_t>(shape[1] * shape[2]) * dtype_size(dt);
      table = std::make_shared<Mem>(tbytes, threads);
      fill_random(table->data(), static_cast<std::size_t>(shape[1] * shape[2]), dt);
      const View tv = View::contiguous(table->data(), dt, {shape[1], shape[2]});
      *k = [=] { (void)learned_forward(LearnedParams{}, xv, tv, Positions{}, yv); };
      *kb = 2.0 * static_cast<double>(bytes) + static_cast<double>(shape[0]) * static_cast<double>(tbytes);
    } else {
      *k = [=] { (void)sinusoidal_forward(SinusoidalParams{}, xv, Positions{}, yv); };
      *kb = 2.0 * static_cast<double>(bytes);
    }
    *b = [=] { par_memcpy(y->data(), x->data(), bytes, threads); };
    *bn = "memcpy";
    *keep = std::make_shared<std::vector<std::shared_ptr<Mem>>>(std::vector<std::shared_ptr<Mem>>{x, y, table});
  };
  return c;
}

Case bias_case(const std::string& enc, std::vector<std::int64_t> shape, DType dt) {
  Case c{enc + ".bias", enc, shape_str(shape), dt, {}};
  c.setup = [=](int threads, std::function<void()>* k, std::function<void()>* b, double* kb, double* bb,
                std::string* bn, std::shared_ptr<void>* keep) {
    const std::int64_t n = shape[0] * shape[1] * shape[2];
    const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dt);
    auto out = std::make_shared<Mem>(bytes, threads);
    auto w = std::make_shared<Mem>(static_cast<std::size_t>(32 * shape[0]) * dtype_size(dt), 1);
    fill_random(w->data(), static_cast<std::size_t>(32 * shape[0]), dt);
    const BiasGeometry g{shape[0], shape[1], shape[2], 0, 0};
    const View ov = View::contiguous(out->data(), dt, shape);
    if (enc == "alibi") {
      *k = [=] { (void)alibi_bias(AlibiParams{}, g, View{}, View{}, ov); };
    } else {
      const View wv = View::contiguous(w->data(), dt, {32, shape[0]});
      *k = [=] { (void)t5_bias(T5Params{}, g, wv, ov); };
    }
    *b = [=] { par_memset(out->data(), bytes, threads); };
    *kb = *bb = static_cast<double>(bytes);
    *bn = "memset";
    *keep = std::make_shared<std::vector<std::shared_ptr<Mem>>>(std::vector<std::shared_ptr<Mem>>{out, w});
  };
  return c;
}

std::vector<Case> default_cases() {
  std::vector<Case> cs;
  const std::vector<std::int64_t> qk = {1, 4096, 32, 128}, dec = {1, 1, 32, 128}, emb = {1, 4096, 4096};
  for (DType dt : {DType::kF32, DType::kBF16})
    for (RopeLayout l : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
      cs.push_back(rope_case("rope.forward.qk", qk, dt, l, false, false));
      cs.push_back(rope_case("rope.forward.qk", qk, dt, l, true, false));
    }
  cs.push_back(rope_case("rope.decode.qk", dec, DType::kF32, RopeLayout::kHalf, false, false));
  cs.push_back(rope_case("rope.decode.qk", dec, DType::kBF16, RopeLayout::kHalf, false, false));
  cs.push_back(rope_case("rope.backward.qk", qk, DType::kF32, RopeLayout::kHalf, false, true));
  for (const char* enc : {"sinusoidal", "learned"})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      cs.push_back(absolute_case(enc, emb, dt, false));
      cs.push_back(absolute_case(enc, emb, dt, true));
    }
  cs.push_back(bias_case("alibi", {8, 2048, 2048}, DType::kF32));
  cs.push_back(bias_case("t5", {8, 2048, 2048}, DType::kF32));
  return cs;
}

}  // namespace

double bench_median_seconds(const std::function<void()>& fn, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) fn();
  const double t0 = now();
  fn();
  const double once = std::max(now() - t0, 1e-9);
  const int iters = std::max(1, static_cast<int>(0.01 / once));
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    const double a = now();
    for (int i = 0; i < iters; ++i) fn();
    samples.push_back((now() - a) / iters);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

std::vector<BenchRow> run_benchmarks(const std::string& filter_regex, int threads,
                                     std::function<void(const BenchRow&)> on_row) {
  const std::regex re(filter_regex.empty() ? std::string(".*") : filter_regex);
  const std::vector<int> counts = threads > 0 ? std::vector<int>{threads} : std::vector<int>{1, 2};
  const int saved = num_threads();
  std::vector<BenchRow> rows;
  for (const Case& c : default_cases()) {
    const std::string line = c.kernel + " " + c.encoding + " " + c.shape + " " + dtype_name(c.dtype);
    if (!std::regex_search(line, re)) continue;
    for (int t : counts) {
      set_num_threads(t);
      std::function<void()> k, b;
      double kb = 0, bb = 0;
      std::string bn;
      std::shared_ptr<void> keep;
      c.setup(t, &k, &b, &kb, &bb, &bn, &keep);
      // Interleave baseline and kernel so both see the same machine state; medians of the rounds.
      std::vector<double> ks, bs;
      for (int round = 0; round < 3; ++round) {
        bs.push_back(bench_median_seconds(b, 1, 3));
        ks.push_back(bench_median_seconds(k, 1, 3));
      }
      std::sort(ks.begin(), ks.end());
      std::sort(bs.begin(), bs.end());
      BenchRow r;
      r.kernel = c.kernel;
      r.encoding = c.encoding;
      r.shape = c.shape;
      r.dtype = dtype_name(c.dtype);
      r.threads = t;
      r.seconds = ks[1];
      r.throughput = kb / r.seconds / 1e9;
      r.baseline = bn;
      r.baseline_throughput = bb / bs[1] / 1e9;
      r.ratio = r.throughput / r.baseline_throughput;
      rows.push_back(r);
      if (on_row) on_row(r);
    }
  }
  set_num_threads(saved == omp_get_max_threads() ? 0 : saved);
  return rows;
}

}  // namespace posenc
