// The benchmark cases of `posenc bench` (see posenc/bench.h: programs, never tests).
#include "bench/bench.h"

#include <cblas.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "attention/attention_fused.h"
#include "core/fast_common.h"
#include "posenc/absolute.h"
#include "posenc/attention.h"
#include "posenc/bias.h"
#include "posenc/registry.h"
#include "posenc/rope.h"
#include "posenc/rotary.h"
#include "posenc/threads.h"
#include "posenc/view.h"

namespace posenc {
namespace {

using I = std::int64_t;
using Clock = std::chrono::steady_clock;

inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// A 64-byte aligned, first-touched buffer (first touch by the threads that will use it).
struct Mem {
  std::unique_ptr<unsigned char[], void (*)(void*)> p{nullptr, std::free};
  std::size_t bytes = 0;
  explicit Mem(std::size_t n, int threads, unsigned char fill = 0) : bytes(n) {
    p.reset(static_cast<unsigned char*>(std::aligned_alloc(64, (n + 63) / 64 * 64)));
    const I chunks = 64;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (I c = 0; c < chunks; ++c) {
      const std::size_t a = n * ix(c) / chunks, b = n * ix(c + 1) / chunks;
      std::memset(p.get() + a, fill, b - a);
    }
  }
  void* data() const { return p.get(); }
};
using Keep = std::vector<std::shared_ptr<Mem>>;

// Baselines, split over threads like the kernels.
void par_memcpy(void* dst, const void* src, std::size_t n, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const std::size_t t = ix(omp_get_thread_num()), T = ix(omp_get_num_threads());
    const std::size_t a = n * t / T / 64 * 64, b = t + 1 == T ? n : n * (t + 1) / T / 64 * 64;
    std::memcpy(static_cast<char*>(dst) + a, static_cast<const char*>(src) + a, b - a);
  }
}
void par_memset(void* dst, std::size_t n, int threads) {
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const std::size_t t = ix(omp_get_thread_num()), T = ix(omp_get_num_threads());
    const std::size_t a = n * t / T / 64 * 64, b = t + 1 == T ? n : n * (t + 1) / T / 64 * 64;
    std::memset(static_cast<char*>(dst) + a, 0, b - a);
  }
}

// The threads a baseline splits over: those of the kernel, which stays on the calling thread below
// fast::kParallelMin elements (a decode step; an OpenMP region would cost more than the copy).
int baseline_threads(I elements, int threads) { return elements < fast::kParallelMin ? 1 : threads; }

// The memcpy baseline of an elementwise kernel that moves `bytes` (read + written): a copy of half
// of them between two buffers of its own, so that it too reads and writes `bytes` in all.
std::function<void()> memcpy_baseline(double bytes, int threads, Keep* keep) {
  const std::size_t half = static_cast<std::size_t>(bytes / 2);
  auto src = std::make_shared<Mem>(half, threads, 1), dst = std::make_shared<Mem>(half, threads);
  keep->push_back(src);
  keep->push_back(dst);
  return [=] { par_memcpy(dst->data(), src->data(), half, threads); };
}

// What a case gives the harness for one thread count.
struct Bound {
  std::function<void()> kernel, baseline;
  double kernel_work = 0, baseline_work = 0;  // bytes (GB/s) or FLOPs (GFLOP/s) of one call
  std::string baseline_name;
  std::shared_ptr<void> keep;  // the buffers, alive while the case runs
};

struct Case {
  Case(std::string k, std::string e, std::string s, DType dt)
      : kernel(std::move(k)), encoding(std::move(e)), shape(std::move(s)), dtype(dt) {}
  std::string kernel, encoding, shape;
  DType dtype;
  std::string unit = "GB/s";
  std::string path;  // attention: "fused" / "reference"
  std::function<Bound(int threads)> setup;
  // Attention other than nope: nope's case of the same kernel, shape and dtype, timed in the same
  // rounds as this one for vs_nope.
  std::function<Bound(int threads)> nope_setup;
};

// Only a strided sample is randomised (setting every element through View would dominate the run
// for the elementwise cases, whose speed does not depend on the values).
void fill_random(void* p, std::size_t n_elems, DType dt) {
  const View v = View::contiguous(p, dt, {static_cast<I>(n_elems)});
  std::uint32_t s = 12345;
  for (std::size_t i = 0; i < n_elems; i += 61) {
    s = s * 1664525u + 1013904223u;
    v.set(static_cast<I>(i), (static_cast<double>(s >> 8) / 16777216.0) - 0.5);
  }
}

// Every element uniform in [−amp, amp) (attention inputs: the softmax and CoPE's gates see real data).
void fill_all(const View& v, std::uint32_t seed, double amp = 1.0) {
  const I n = v.numel();
  std::uint32_t s = seed * 2654435761u + 1u;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return amp * (2.0 * (static_cast<double>(s >> 8) / 16777216.0) - 1.0);
  };
  if (v.dtype == DType::kF32 && v.is_contiguous()) {
    float* p = static_cast<float*>(v.data);
    for (I i = 0; i < n; ++i) p[i] = static_cast<float>(next());
  } else {
    for (I i = 0; i < n; ++i) v.set(i, next());
  }
}

std::string shape_str(const std::vector<I>& s) {
  return View::contiguous(nullptr, DType::kF32, s).shape_str();
}

I numel(const std::vector<I>& s) {
  I n = 1;
  for (I e : s) n *= e;
  return n;
}

// ---- elementwise cases ----------------------------------------------------------------------------

// scheme: "" plain RoPE; "yarn" Qwen2.5's YaRN (theta 10⁶, s = 4, L = 32768: attention factor ≠ 1);
// "hf" plain RoPE with transformers' float32 angles (formed per token).
RopeParams bench_rope_params(const std::string& scheme, RopeLayout layout) {
  RopeParams p;
  p.layout = layout;
  if (scheme == "yarn") {
    p.rope_type = RopeType::kYarn;
    p.theta = 1e6;
    p.factor = 4;
    p.original_max_position = 32768;
  } else if (scheme == "hf") {
    p.angles = RopeAngles::kHf;
  }
  return p;
}

Case rope_case(const std::string& kernel, std::vector<I> shape, DType dt, RopeLayout layout, bool in_place,
               bool backward, const std::string& scheme = "") {
  Case c{kernel + "." + rope_layout_name(layout) + (in_place ? ".inplace" : "") + (scheme.empty() ? "" : "." + scheme),
         "rope", shape_str(shape), dt};
  c.setup = [=](int threads) {
    const I n = numel(shape);
    const std::size_t bytes = ix(n) * dtype_size(dt);
    auto q = std::make_shared<Mem>(bytes, threads), kk = std::make_shared<Mem>(bytes, threads);
    auto qo = std::make_shared<Mem>(bytes, threads), ko = std::make_shared<Mem>(bytes, threads);
    fill_random(q->data(), ix(n), dt);
    fill_random(kk->data(), ix(n), dt);
    const RopeParams p = bench_rope_params(scheme, layout);
    const View qv = View::contiguous(q->data(), dt, shape), kv = View::contiguous(kk->data(), dt, shape);
    const View qov = in_place ? qv : View::contiguous(qo->data(), dt, shape);
    const View kov = in_place ? kv : View::contiguous(ko->data(), dt, shape);
    Positions pos;
    pos.offset = shape[1] == 1 ? 4095 : 0;  // a decode step sits at the end of the context
    auto keep = std::make_shared<Keep>(Keep{q, kk, qo, ko});
    Bound b;
    b.kernel = [=] { (void)rope_apply_qk(p, qv, kv, pos, qov, kov, backward); };
    b.kernel_work = b.baseline_work = 4.0 * static_cast<double>(bytes);  // q, k read and written
    b.baseline = memcpy_baseline(b.kernel_work, baseline_threads(n, threads), keep.get());
    b.baseline_name = "memcpy";
    b.keep = keep;
    return b;
  };
  return c;
}

Case absolute_case(const std::string& enc, std::vector<I> shape, DType dt, bool in_place) {
  Case c{enc + ".forward" + (in_place ? ".inplace" : ""), enc, shape_str(shape), dt};
  c.setup = [=](int threads) {
    const I n = numel(shape);
    const std::size_t bytes = ix(n) * dtype_size(dt);
    auto x = std::make_shared<Mem>(bytes, threads), y = std::make_shared<Mem>(bytes, threads);
    fill_random(x->data(), ix(n), dt);
    const View xv = View::contiguous(x->data(), dt, shape);
    const View yv = in_place ? xv : View::contiguous(y->data(), dt, shape);
    auto keep = std::make_shared<Keep>(Keep{x, y});
    Bound b;
    b.kernel_work = 2.0 * static_cast<double>(bytes);  // x read, y written
    if (enc == "learned") {
      // The table rows of positions 0 .. L−1 are read once per batch element.
      const std::size_t tbytes = ix(shape[1] * shape[2]) * dtype_size(dt);
      auto table = std::make_shared<Mem>(tbytes, threads);
      fill_random(table->data(), ix(shape[1] * shape[2]), dt);
      keep->push_back(table);
      const View tv = View::contiguous(table->data(), dt, {shape[1], shape[2]});
      b.kernel = [=] { (void)learned_forward(LearnedParams{}, xv, tv, Positions{}, yv); };
      b.kernel_work += static_cast<double>(shape[0]) * static_cast<double>(tbytes);
    } else {
      b.kernel = [=] { (void)sinusoidal_forward(SinusoidalParams{}, xv, Positions{}, yv); };
    }
    b.baseline_work = b.kernel_work;
    b.baseline = memcpy_baseline(b.kernel_work, baseline_threads(n, threads), keep.get());
    b.baseline_name = "memcpy";
    b.keep = keep;
    return b;
  };
  return c;
}

Case bias_case(const std::string& enc, std::vector<I> shape, DType dt) {
  Case c{enc + ".bias", enc, shape_str(shape), dt};
  c.setup = [=](int threads) {
    const std::size_t bytes = ix(numel(shape)) * dtype_size(dt);
    auto out = std::make_shared<Mem>(bytes, threads);
    auto w = std::make_shared<Mem>(ix(64 * shape[0]) * dtype_size(dt), 1);  // weights of any of them
    fill_random(w->data(), ix(64 * shape[0]), dt);
    const BiasGeometry g{shape[0], shape[1], shape[2], 0, 0};
    const View ov = View::contiguous(out->data(), dt, shape);
    Bound b;
    const I H = shape[0];
    if (enc == "alibi") {
      b.kernel = [=] { (void)alibi_bias(AlibiParams{}, g, View{}, View{}, ov); };
    } else if (enc == "kerple") {  // log kernel; r1, r2 positive (the buffer's first 2H values)
      const View r1 = View::contiguous(w->data(), dt, {H});
      const View r2 = View::contiguous(static_cast<char*>(w->data()) + ix(H) * dtype_size(dt), dt, {H});
      for (I h = 0; h < H; ++h) r1.set(h, 0.5 + 0.1 * static_cast<double>(h)), r2.set(h, 0.1 + 0.05 * static_cast<double>(h));
      b.kernel = [=] { (void)kerple_bias(KerpleParams{}, g, r1, r2, ov); };
    } else if (enc == "sandwich") {
      b.kernel = [=] { (void)sandwich_bias(SandwichParams{}, g, ov); };
    } else if (enc == "fire") {  // width 32, c = 0.1, L = 512 (the paper's), the MLP from the buffer
      const I W = 32;
      char* base = static_cast<char*>(w->data());
      auto at = [&](I off) { return base + ix(off) * dtype_size(dt); };
      FireTensors f;
      f.w1 = View::contiguous(at(0), dt, {W});
      f.b1 = View::contiguous(at(W), dt, {W});
      f.w2 = View::contiguous(at(2 * W), dt, {H, W});  // 2W + H·W ≤ 64·H for H ≥ 2
      fill_all(f.w1, 7, 1.0);
      fill_all(f.b1, 8, 0.5);
      fill_all(f.w2, 9, 0.3);
      auto extra = std::make_shared<std::vector<double>>(std::vector<double>(ix(H) + 2, 0.1));
      f.b2 = View::contiguous(extra->data(), DType::kF64, {H});
      f.c = View::contiguous(extra->data() + H, DType::kF64, {1});
      f.threshold = View::contiguous(extra->data() + H + 1, DType::kF64, {1});
      (*extra)[ix(H + 1)] = 512.0;
      b.kernel = [=] { (void)fire_bias(FireParams{}, g, f, ov); (void)extra; };
    } else {
      const View wv = View::contiguous(w->data(), dt, {32, shape[0]});
      b.kernel = [=] { (void)t5_bias(T5Params{}, g, wv, ov); };
    }
    const int bt = baseline_threads(numel(shape), threads);
    b.baseline = [=] { par_memset(out->data(), bytes, bt); };
    b.kernel_work = b.baseline_work = static_cast<double>(bytes);  // write-only (the weights are tiny)
    b.baseline_name = "memset";
    b.keep = std::make_shared<Keep>(Keep{out, w});
    return b;
  };
  return c;
}

// ---- attention ------------------------------------------------------------------------------------

constexpr I kHeads = 8, kHeadDim = 64, kXlR = 64, kCopeNpos = 64, kT5Buckets = 32;
constexpr I kFireWidth = 32;  // the FIRE paper's MLP width

// One attention problem: causal, B = 1, Hq = Hkv = kHeads, d = kHeadDim, L queries and keys, with the
// encoding's tensors (random), and for backward dout and every gradient buffer.
struct AttnProblem {
  AttentionParams p;
  Keep mem;
  std::vector<std::vector<float>> small;  // encoding tensors and their gradients
  std::vector<std::int64_t> qpos;         // rope2d [2, L], mrope [3, L] positions (queries = keys)
  View q, k, v, out, dout, dq, dk, dv;
  EncodingTensors t;
  EncodingGrads g;
  double io_bytes = 0;  // inputs + outputs of the call
};

std::shared_ptr<AttnProblem> make_attention(Encoding enc, I L, DType dt, bool backward, int threads,
                                            bool mixed = false) {
  auto a = std::make_shared<AttnProblem>();
  a->p.encoding = enc;
  a->p.causal = true;
  const std::vector<I> shape = {1, L, kHeads, kHeadDim};
  const std::size_t bytes = ix(numel(shape)) * dtype_size(dt);
  std::uint32_t seed = 1;
  auto big = [&](bool random) {
    auto m = std::make_shared<Mem>(bytes, threads);
    a->mem.push_back(m);
    const View v = View::contiguous(m->data(), dt, shape);
    if (random) fill_all(v, seed++);
    a->io_bytes += static_cast<double>(bytes);
    return v;
  };
  auto small = [&](std::vector<I> s, bool random, double amp) {
    a->small.emplace_back(ix(numel(s)), 0.f);
    const View v = View::contiguous(a->small.back().data(), DType::kF32, s);
    if (random) fill_all(v, seed++, amp);
    a->io_bytes += static_cast<double>(v.numel()) * 4;
    return v;
  };
  a->small.reserve(16);  // views point into these vectors: no reallocation
  a->q = big(true);
  a->k = big(true);
  a->v = big(true);
  if (backward) {
    a->dout = big(true);
    a->dq = big(false);
    a->dk = big(false);
    a->dv = big(false);
  } else {
    a->out = big(false);
  }
  switch (enc) {
    case Encoding::kT5:
      a->t.weights = small({kT5Buckets, kHeads}, true, 1.0);
      if (backward) a->g.weights = small({kT5Buckets, kHeads}, false, 0);
      break;
    case Encoding::kXL:
      a->t.u = small({kHeads, kHeadDim}, true, 0.5);
      a->t.v = small({kHeads, kHeadDim}, true, 0.5);
      a->t.rel_proj = small({kHeads, kHeadDim, kXlR}, true, 0.2);
      if (backward) {
        a->g.u = small({kHeads, kHeadDim}, false, 0);
        a->g.v = small({kHeads, kHeadDim}, false, 0);
        a->g.rel_proj = small({kHeads, kHeadDim, kXlR}, false, 0);
      }
      break;
    case Encoding::kCope:
      a->t.table = small({kCopeNpos, kHeadDim}, true, 0.5);
      if (backward) a->g.table = small({kCopeNpos, kHeadDim}, false, 0);
      break;
    case Encoding::kKerple: {
      // Log kernel (the paper's best), r1 and r2 spread over the ranges of the authors' uniform
      // initialisation (r1 in (0, 2), r2 in (0, 1)).
      a->t.r1 = small({kHeads}, false, 0);
      a->t.r2 = small({kHeads}, false, 0);
      for (I h = 0; h < kHeads; ++h) {
        a->t.r1.set(h, 0.25 + 1.5 * static_cast<double>(h) / kHeads);
        a->t.r2.set(h, 0.05 + 0.9 * static_cast<double>(kHeads - 1 - h) / kHeads);
      }
      if (backward) {
        a->g.r1 = small({kHeads}, false, 0);
        a->g.r2 = small({kHeads}, false, 0);
      }
      break;
    }
    case Encoding::kFire: {
      // The paper's width (32) and initial c = 0.1, L = 512; the MLP random.
      FireTensors& f = a->t.fire;
      f.w1 = small({kFireWidth}, true, 1.0);
      f.b1 = small({kFireWidth}, true, 0.5);
      f.w2 = small({kHeads, kFireWidth}, true, 0.3);
      f.b2 = small({kHeads}, true, 0.3);
      f.c = small({1}, false, 0);
      f.threshold = small({1}, false, 0);
      f.c.set(0, 0.1);
      f.threshold.set(0, 512.0);
      if (backward) {
        FireTensors& gf = a->g.fire;
        gf.w1 = small({kFireWidth}, false, 0);
        gf.b1 = small({kFireWidth}, false, 0);
        gf.w2 = small({kHeads, kFireWidth}, false, 0);
        gf.b2 = small({kHeads}, false, 0);
        gf.c = small({1}, false, 0);
        gf.threshold = small({1}, false, 0);
      }
      break;
    }
    case Encoding::kRope2d: {
      // An image: token l at (x, y) = (l mod W, l / W), W = ⌈√L⌉.
      I W = 1;
      while (W * W < L) ++W;
      a->qpos.resize(ix(2 * L));
      for (I l = 0; l < L; ++l) a->qpos[ix(l)] = l % W, a->qpos[ix(L + l)] = l / W;
      a->t.q_positions = a->t.k_positions = View::contiguous(a->qpos.data(), DType::kI64, {2, L});
      if (mixed) {  // the authors' initialisation, per-head angles h·0.7
        a->p.rope2d.variant = Rope2dVariant::kMixed;
        std::vector<double> angles;
        for (I h = 0; h < kHeads; ++h) angles.push_back(0.7 * static_cast<double>(h));
        const std::vector<double> f = rope2d_mixed_init(kHeads, kHeadDim, 10.0, angles).value();
        a->t.freqs = small({2, kHeads, kHeadDim / 2}, false, 0);
        for (I i = 0; i < a->t.freqs.numel(); ++i) a->t.freqs.set(i, f[ix(i)]);
        if (backward) a->g.freqs = small({2, kHeads, kHeadDim / 2}, false, 0);
      }
      break;
    }
    case Encoding::kMrope: {
      // Qwen2-VL's proportions (16, 24, 24 of 64 pairs) for d = 64, on the ids of text, an image of
      // 3s × 5s merged tokens (15s² ≤ 0.95·L) and text (mrope_positions).
      a->p.mrope.mrope_section = {8, 12, 12};
      I s = 1;
      while (15 * (s + 1) * (s + 1) <= L * 95 / 100) ++s;
      const I before = std::max<I>(1, L / 64), grid = 15 * s * s;
      using K = MropeSegment::Kind;
      std::vector<MropeSegment> segs = {{K::kText, before}};
      if (before + grid <= L) segs.push_back({K::kImage, 0, 1, 3 * s, 5 * s});
      const I after = L - before - (before + grid <= L ? grid : 0);
      if (after > 0) segs.push_back({K::kText, after});
      a->qpos = mrope_positions(segs).value().ids;
      a->t.q_positions = a->t.k_positions = View::contiguous(a->qpos.data(), DType::kI64, {3, L});
      break;
    }
    default:
      break;  // nope, rope, xpos, alibi (symmetric, slopes by the paper's rule), sandwich: no tensors
  }
  return a;
}

Status run_attention(const AttnProblem& a, bool backward) {
  if (backward) return attention_backward(a.p, a.q, a.k, a.v, a.t, a.dout, a.dq, a.dk, a.dv, a.g);
  return attention_forward(a.p, a.q, a.k, a.v, a.t, a.out);
}

// Useful FLOPs (see bench.h): 4·B·H·M·N·d, halved when causal; backward 2.5×.
double attention_flops(I L, bool backward) {
  const double f = 4.0 * kHeads * static_cast<double>(L) * static_cast<double>(L) * kHeadDim / 2;
  return backward ? 2.5 * f : f;
}

// The sgemm baseline: the unfused attention's two products per head, S = q·kᵀ then S·v, with
// OpenBLAS at `threads` threads (restored after).
struct SgemmAttention {
  I L;
  int threads;
  Keep mem;
  float *q, *k, *v, *s, *o;
  SgemmAttention(I len, int t) : L(len), threads(t) {
    const std::size_t qb = ix(L * kHeads * kHeadDim) * sizeof(float);
    for (int i = 0; i < 4; ++i) mem.push_back(std::make_shared<Mem>(qb, t));
    mem.push_back(std::make_shared<Mem>(ix(L * L) * sizeof(float), t));
    q = static_cast<float*>(mem[0]->data());
    k = static_cast<float*>(mem[1]->data());
    v = static_cast<float*>(mem[2]->data());
    o = static_cast<float*>(mem[3]->data());
    s = static_cast<float*>(mem[4]->data());
    for (int i = 0; i < 3; ++i)
      fill_all(View::contiguous(mem[ix(i)]->data(), DType::kF32, {L, kHeads, kHeadDim}),
               100u + static_cast<std::uint32_t>(i));
  }
  void run() const {
    const int prev = openblas_get_num_threads();
    openblas_set_num_threads(threads);
    const int ld = static_cast<int>(kHeads * kHeadDim), n = static_cast<int>(L),
              d = static_cast<int>(kHeadDim);
    for (I h = 0; h < kHeads; ++h) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, 1.f, q + h * kHeadDim, ld,
                  k + h * kHeadDim, ld, 0.f, s, n);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, 1.f, s, n, v + h * kHeadDim, ld, 0.f,
                  o + h * kHeadDim, ld);
    }
    openblas_set_num_threads(prev);
  }
  double flops() const { return 4.0 * kHeads * static_cast<double>(L) * static_cast<double>(L) * kHeadDim; }
};

// The encodings the attention takes: the registry's, but for the absolute ones (they act on
// embeddings, before the first layer).
std::vector<const EncodingInfo*> attention_encodings() {
  std::vector<const EncodingInfo*> r;
  for (const EncodingInfo& e : registry())
    if (e.kind != Kind::kAbsolute) r.push_back(&e);
  return r;
}

std::string attention_path(Encoding enc, DType dt) {
  AttentionParams p;
  p.encoding = enc;
  p.causal = true;
  return fused::supports(p, dt) ? "fused" : "reference";
}

Case attention_case(const EncodingInfo& e, I L, DType dt, bool backward, bool mixed = false) {
  Case c{std::string(backward ? "attention.backward" : "attention.forward") + (mixed ? ".mixed" : ""), e.name,
         shape_str({1, L, kHeads, kHeadDim}), dt};
  c.unit = "GFLOP/s";
  c.path = attention_path(e.id, dt);
  const Encoding enc = e.id;
  if (enc != Encoding::kNope) c.nope_setup = attention_case(encoding_info(Encoding::kNope), L, dt, backward).setup;
  c.setup = [=](int threads) {
    auto a = make_attention(enc, L, dt, backward, threads, mixed);
    auto s = std::make_shared<SgemmAttention>(L, threads);
    Bound b;
    b.kernel = [=] {
      const Status st = run_attention(*a, backward);
      if (!st.ok()) std::fprintf(stderr, "posenc bench: attention refused: %s\n", st.message().c_str());
    };
    b.baseline = [=] { s->run(); };
    b.kernel_work = attention_flops(L, backward);
    b.baseline_work = s->flops();
    b.baseline_name = "sgemm";
    b.keep =
        std::make_shared<std::tuple<std::shared_ptr<AttnProblem>, std::shared_ptr<SgemmAttention>>>(a, s);
    return b;
  };
  return c;
}

// ---- decode ----------------------------------------------------------------------------------------

// The encodings of the decode rows: those the decode kernel takes (rope with keys_rotated).
const std::vector<Encoding>& decode_encodings() {
  static const std::vector<Encoding> e = {Encoding::kNope, Encoding::kRope, Encoding::kAlibi, Encoding::kT5,
                                          Encoding::kKerple, Encoding::kSandwich, Encoding::kFire};
  return e;
}

std::atomic<std::uint64_t> g_sink{0};  // the read baseline's sums, so that the reads stay

// The read baseline of a decode row: sums every 8-byte word of the K and V buffers (the very bytes
// the kernel reads), split over the threads like the kernel's (batch, kv head, key part) tasks.
void sum_bytes(const void* a, const void* b, std::size_t bytes, int threads) {
  const std::size_t words = bytes / 8;
  std::uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total) if (threads > 1)
  {
    const std::size_t t = ix(omp_get_thread_num()), T = ix(omp_get_num_threads());
    for (const void* buf : {a, b}) {
      const std::uint64_t* p = static_cast<const std::uint64_t*>(buf);
      const std::size_t lo = words * t / T, hi = words * (t + 1) / T;
      std::uint64_t s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::size_t i = lo;
      for (; i + 8 <= hi; i += 8)
        for (int e = 0; e < 8; ++e) s[e] += p[i + ix(e)];
      for (; i < hi; ++i) s[0] += p[i];
      for (std::uint64_t x : s) total += x;
    }
  }
  g_sink += total;
}

// A decode step: M = 1 query at the end of N cached keys, q [1, 1, Hq, D], k and v [1, N, Hkv, D]
// of dtype dt (rope: keys_rotated, the cache holds rotated keys), not causal (the one query sees every
// key either way). Rate: the K and V bytes read per second; baseline: sum_bytes over the same buffers.
Case decode_case(Encoding enc, I N, I Hq, I Hkv, I D, DType dt) {
  Case c{"attention.decode", encoding_info(enc).name, shape_str({1, N, Hkv, D}) + "/" + std::to_string(Hq), dt};
  c.path = "decode";
  c.setup = [=](int threads) {
    auto a = std::make_shared<AttnProblem>();
    a->p.encoding = enc;
    a->p.keys_rotated = enc == Encoding::kRope;
    const std::size_t es = dtype_size(dt), kv = ix(N * Hkv * D) * es;
    auto qm = std::make_shared<Mem>(ix(Hq * D) * es, 1), om = std::make_shared<Mem>(ix(Hq * D) * es, 1);
    auto km = std::make_shared<Mem>(kv, threads), vm = std::make_shared<Mem>(kv, threads);
    a->mem = {qm, om, km, vm};
    a->q = View::contiguous(qm->data(), dt, {1, 1, Hq, D});
    a->out = View::contiguous(om->data(), dt, {1, 1, Hq, D});
    a->k = View::contiguous(km->data(), dt, {1, N, Hkv, D});
    a->v = View::contiguous(vm->data(), dt, {1, N, Hkv, D});
    fill_all(a->q, 1);
    fill_random(km->data(), ix(N * Hkv * D), dt);  // a strided sample: the speed does not depend on it
    fill_random(vm->data(), ix(N * Hkv * D), dt);
    auto small = [&](std::vector<I> s, double lo, double step) {
      a->small.emplace_back(ix(numel(s)), 0.f);
      for (std::size_t e = 0; e < a->small.back().size(); ++e) a->small.back()[e] = static_cast<float>(lo + step * double(e));
      return View::contiguous(a->small.back().data(), DType::kF32, s);
    };
    a->small.reserve(8);
    if (enc == Encoding::kT5) a->t.weights = small({kT5Buckets, Hq}, -0.5, 0.001);
    if (enc == Encoding::kKerple) a->t.r1 = small({Hq}, 0.25, 0.04), a->t.r2 = small({Hq}, 0.05, 0.02);
    if (enc == Encoding::kFire) {
      FireTensors& f = a->t.fire;
      f.w1 = small({kFireWidth}, -1.0, 0.06);
      f.b1 = small({kFireWidth}, 0.5, -0.03);
      f.w2 = small({Hq, kFireWidth}, -0.3, 0.0006);
      f.b2 = small({Hq}, 0.1, 0.0);
      f.c = small({1}, 0.1, 0);
      f.threshold = small({1}, 512.0, 0);
    }
    Bound b;
    b.kernel = [=] {
      const Status st = attention_forward(a->p, a->q, a->k, a->v, a->t, a->out);
      if (!st.ok()) std::fprintf(stderr, "posenc bench: attention refused: %s\n", st.message().c_str());
    };
    b.baseline = [=] { sum_bytes(km->data(), vm->data(), kv, threads); };
    b.kernel_work = b.baseline_work = 2.0 * static_cast<double>(kv);
    b.baseline_name = "sum";
    b.keep = a;
    return b;
  };
  return c;
}

// ---- the default list ------------------------------------------------------------------------------

std::vector<Case> default_cases() {
  std::vector<Case> cs;
  const std::vector<I> qk = {1, 4096, 32, 128}, dec = {1, 1, 32, 128}, emb = {1, 4096, 4096};
  for (DType dt : {DType::kF32, DType::kBF16})
    for (RopeLayout l : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
      cs.push_back(rope_case("rope.forward.qk", qk, dt, l, false, false));
      cs.push_back(rope_case("rope.forward.qk", qk, dt, l, true, false));
    }
  cs.push_back(rope_case("rope.decode.qk", dec, DType::kF32, RopeLayout::kHalf, false, false));
  cs.push_back(rope_case("rope.decode.qk", dec, DType::kBF16, RopeLayout::kHalf, false, false));
  cs.push_back(rope_case("rope.backward.qk", qk, DType::kF32, RopeLayout::kHalf, false, true));
  cs.push_back(rope_case("rope.forward.qk", qk, DType::kF32, RopeLayout::kHalf, false, false, "yarn"));
  cs.push_back(rope_case("rope.forward.qk", qk, DType::kF32, RopeLayout::kHalf, false, false, "hf"));
  for (const char* enc : {"sinusoidal", "learned"})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      cs.push_back(absolute_case(enc, emb, dt, false));
      cs.push_back(absolute_case(enc, emb, dt, true));
    }
  cs.push_back(bias_case("alibi", {8, 2048, 2048}, DType::kF32));
  cs.push_back(bias_case("t5", {8, 2048, 2048}, DType::kF32));
  for (const char* enc : {"kerple", "sandwich", "fire"}) cs.push_back(bias_case(enc, {8, 2048, 2048}, DType::kF32));
  // Attention (each encoding other than nope times nope beside it, for vs_nope).
  for (I L : {I{1024}, I{4096}})
    for (bool backward : {false, true}) {
      for (const EncodingInfo* e : attention_encodings())
        cs.push_back(attention_case(*e, L, DType::kF32, backward));
      if (L == 4096) {
        cs.push_back(attention_case(encoding_info(Encoding::kRope2d), L, DType::kF32, backward, true));
        for (const EncodingInfo* e : attention_encodings())
          if (e->id == Encoding::kNope || e->id == Encoding::kRope)
            cs.push_back(attention_case(*e, L, DType::kBF16, backward));
      }
    }
  // Decode steps (Hq = 32, Hkv = 8, D = 128: Llama 3 8B's attention; and Hq = 8, Hkv = 2, D = 64).
  for (I N : {I{32768}, I{131072}})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (Encoding e : decode_encodings()) cs.push_back(decode_case(e, N, 32, 8, 128, dt));
  for (DType dt : {DType::kF32, DType::kF16}) cs.push_back(decode_case(Encoding::kNope, 32768, 8, 2, 64, dt));
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
// machine state; see bench.h.
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

// ---- memory rows ----------------------------------------------------------------------------------

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
      const bool attention = c.kernel.rfind("attention.", 0) == 0 && c.path != "decode";
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
      if (path != "fused") {
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
