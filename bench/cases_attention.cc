// The attention cases of `posenc bench`: the public forward and backward per encoding against the
// unfused attention's two sgemm products, and the problems the memory rows run.
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <tuple>

#include "attention/attention_fused.h"
#include "bench/bench_cases.h"
#include "posenc/rotary.h"

namespace posenc::bench_impl {

namespace {

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

// The encoding's tensors of a bench attention problem (and their gradients' buffers when backward),
// from small(shape, random, amplitude); rope2d and mrope: the token positions, in a->qpos.
void encoding_tensors(AttnProblem* a, Encoding enc, I L, bool backward, bool mixed,
                      const std::function<View(std::vector<I>, bool, double)>& small) {
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
}

}  // namespace

std::shared_ptr<AttnProblem> make_attention(Encoding enc, I L, DType dt, bool backward, int threads,
                                            bool mixed) {
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
  encoding_tensors(a.get(), enc, L, backward, mixed, small);
  return a;
}

std::shared_ptr<AttnProblem> make_attention_saved(Encoding enc, I L, DType dt, int threads) {
  auto a = make_attention(enc, L, dt, true, threads);
  auto m = std::make_shared<Mem>(ix(L * kHeads * kHeadDim) * dtype_size(dt), threads);
  a->mem.push_back(m);
  a->out = View::contiguous(m->data(), dt, {1, L, kHeads, kHeadDim});
  a->lse_buf.assign(ix(kHeads * L), 0.0);
  a->lse = View::contiguous(a->lse_buf.data(), DType::kF64, {1, kHeads, L});
  const Status st = attention_forward(a->p, a->q, a->k, a->v, a->t, a->out, a->lse);
  if (!st.ok()) std::fprintf(stderr, "posenc bench: attention refused: %s\n", st.message().c_str());
  return a;
}

Status run_attention(const AttnProblem& a, bool backward) {
  if (backward) return attention_backward(a.p, a.q, a.k, a.v, a.t, a.dout, a.dq, a.dk, a.dv, a.g);
  return attention_forward(a.p, a.q, a.k, a.v, a.t, a.out);
}

double attention_flops(I L, bool backward) {
  const double f = 4.0 * kHeads * static_cast<double>(L) * static_cast<double>(L) * kHeadDim / 2;
  return backward ? 2.5 * f : f;
}

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
  if (!fused::supports(p, dt)) return "reference";
  const std::string pairs = dt == DType::kBF16 ? fused::bf16_products(p) : "";
  return pairs.empty() ? "fused" : "fused+" + pairs;
}

namespace {

// saved: the backward given the forward's out and lse (attention_backward_from_stats), as a training
// step that keeps them runs it; the plain backward computes them again first.
Case attention_case(const EncodingInfo& e, I L, DType dt, bool backward, bool mixed = false, bool saved = false) {
  Case c{std::string(backward ? (saved ? "attention.backward.saved" : "attention.backward") : "attention.forward") +
             (mixed ? ".mixed" : ""),
         e.name, shape_str({1, L, kHeads, kHeadDim}), dt};
  c.unit = "GFLOP/s";
  c.path = attention_path(e.id, dt);
  const Encoding enc = e.id;
  if (enc != Encoding::kNope)
    c.nope_setup = attention_case(encoding_info(Encoding::kNope), L, dt, backward, false, saved).setup;
  c.setup = [=](int threads) {
    auto a = saved ? make_attention_saved(enc, L, dt, threads) : make_attention(enc, L, dt, backward, threads, mixed);
    auto s = std::make_shared<SgemmAttention>(L, threads);
    Bound b;
    b.kernel = [=] {
      const Status st = saved ? attention_backward_from_stats(a->p, a->q, a->k, a->v, a->t, a->out, a->lse, a->dout,
                                                              a->dq, a->dk, a->dv, a->g)
                              : run_attention(*a, backward);
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

}  // namespace

std::vector<Case> attention_cases() {
  std::vector<Case> cs;
  // each encoding other than nope times nope beside it, for vs_nope
  for (I L : {I{1024}, I{4096}})
    for (bool backward : {false, true}) {
      for (const EncodingInfo* e : attention_encodings())
        cs.push_back(attention_case(*e, L, DType::kF32, backward));
      if (L == 4096) {
        cs.push_back(attention_case(encoding_info(Encoding::kRope2d), L, DType::kF32, backward, true));
        for (const EncodingInfo* e : attention_encodings())
          if (e->id == Encoding::kNope || e->id == Encoding::kRope)
            for (DType dt : {DType::kBF16, DType::kF16}) cs.push_back(attention_case(*e, L, dt, backward));
      }
    }
  // The backward from saved statistics (every encoding but cope, which attention_backward_from_stats
  // does not take), float32, L = 4096.
  for (const EncodingInfo* e : attention_encodings())
    if (e->id != Encoding::kCope) cs.push_back(attention_case(*e, 4096, DType::kF32, true, false, true));
  return cs;
}

}  // namespace posenc::bench_impl
