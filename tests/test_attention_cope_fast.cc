// The fused CoPE attention, posenc::fused:: (src/attention/attention_cope_cpu.cc), against the
// plain reference posenc::reference:: (src/attention/attention_ref.cc): out, lse, dq, dk, dv and
// dtable, for causal or not × M = N, decode (M = 1), M < N, M > N × grouped-query heads × global
// offsets × float32, bfloat16 and float16 q/k/v × float32 and float64 tables × sizes off the tile
// (L ∈ {1, 3, 19, 130}, D ∈ {2, 6, 64, 130}) × npos ∈ {1, 2, 5, 64, 300} (positions clamped
// everywhere, on part of each row, or nowhere) × 1 and 2 threads; sparse gates (rows unclamped
// over many keys); every SIMD target on a case that runs all tile paths; L = 989; the backward's
// query rows in several chunks, with every subset of the gradients, and 16-bit dk, dv summed over
// them rounded once; peak memory of a long sequence; the dispatcher's choice.
//
// The reference sees exactly what the kernel reads: inputs are rounded to the dtype first.
// q and k are drawn with σ = 1.5, so scale·q·k has σ = 2.25 and the gates spread over (0, 1)
// instead of sitting near 1/2.
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attention/attention_decode.h"
#include "attention/attention_fused.h"
#include "attention_fast_testing.h"
#include "posenc/attention.h"
#include "posenc/half.h"
#include "posenc/threads.h"
#include "testing.h"
#include "typed_tensor.h"

namespace posenc {
namespace {

using ::posenc::testing::AllClose;
using ::posenc::testing::randn;
using I = std::int64_t;
using Vec = std::vector<double>;

std::size_t ix(I i) { return static_cast<std::size_t>(i); }

using Tensor = testing::TypedTensor;

// The fused attention's shapes (attention_fast_testing.h): sizes and the optional offsets.
using Case = fast_testing::Shape;
using NamedCase = fast_testing::NamedShape;

// One problem's inputs, rounded to the dtype.
struct Problem {
  AttentionParams p;
  Case c;
  I npos;
  Tensor q, k, v, dout, table;

  // shift > 0 adds +shift to q's and −shift to k's first coordinate: logits near −shift²·scale,
  // sparse gates, counts that grow slowly.
  Problem(const Case& cs, bool causal, I np, DType dt, DType table_dt, std::uint64_t seed,
          double shift = 0)
      : c(cs), npos(np),
        q(dt, shifted(randn(ix(cs.B * cs.M * cs.Hq * cs.D), seed + 1, 1.5), cs.D, shift),
          {cs.B, cs.M, cs.Hq, cs.D}),
        k(dt, shifted(randn(ix(cs.B * cs.N * cs.Hkv * cs.D), seed + 2, 1.5), cs.D, -shift),
          {cs.B, cs.N, cs.Hkv, cs.D}),
        v(dt, randn(ix(cs.B * cs.N * cs.Hkv * cs.D), seed + 3), {cs.B, cs.N, cs.Hkv, cs.D}),
        dout(dt, randn(ix(cs.B * cs.M * cs.Hq * cs.D), seed + 4), {cs.B, cs.M, cs.Hq, cs.D}),
        table(table_dt, randn(ix(np * cs.D), seed + 5, 0.3), {np, cs.D}) {
    p.encoding = Encoding::kCope;
    p.causal = causal;
    p.q_offset = cs.q_off;
    p.k_offset = cs.k_off;
  }
  static Vec shifted(Vec x, I D, double by) {
    for (std::size_t i = 0; i < x.size(); i += ix(D)) x[i] += by;
    return x;
  }
  EncodingTensors tensors() {
    EncodingTensors t;
    t.table = table.view();
    return t;
  }
  std::vector<std::int64_t> lse_shape() const { return {c.B, c.Hq, c.M}; }
};

// Largest |x|, for tolerances scaled to the tensor.
double amax(const Vec& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::isfinite(v) ? std::fabs(v) : 0.0);
  return m;
}

// |got − want| ≤ atol·max|want| + rtol·|want|.
::testing::AssertionResult Close(const Vec& got, const Vec& want, double atol, double rtol) {
  return AllClose(got, want, atol * std::max(amax(want), 1e-30), rtol);
}

// Tolerances (|got − want| ≤ atol·max|want| + rtol·|want|). float32: the product and the softmax
// carry the usual float32 error; the count p adds its own, ~1e-6 absolute (gates from float logits,
// sums rounded by 2^-24 per gate), which z turns into logit error at the rate q·(e_⌈p⌉ − e_⌊p⌋), a
// few units here: measured up to 5e-6 (out) and 2e-5 (gradients) relative to the largest entry, so
// 2e-5 and 1e-4. bfloat16 adds its output rounding (2^-8 relative), as in attention_fast_testing.h.
struct Tol {
  double atol, rtol;
};
Tol tol_out(DType t) { return t == DType::kF32 ? Tol{2e-5, 2e-5} : Tol{8e-3, 8e-3}; }
Tol tol_grad(DType t) { return t == DType::kF32 ? Tol{1e-4, 1e-4} : Tol{1.6e-2, 1.6e-2}; }

// An output tensor holding 7 everywhere: the kernel must write every entry (0 where nothing reaches).
Tensor filled(DType t, const std::vector<std::int64_t>& shape) {
  return Tensor(t, Vec(Tensor::count(shape), 7.0), shape);
}

// Forward and backward of the kernel and the reference on the same inputs.
void check(Problem& pr) {
  const Case& c = pr.c;
  const DType dt = pr.q.dtype;
  const EncodingTensors t = pr.tensors();
  EncodingTensors t64;
  t64.table = pr.table.view64();
  // forward
  Tensor out = filled(dt, {c.B, c.M, c.Hq, c.D});
  Vec lse(ix(c.B * c.Hq * c.M), 7.0), want(out.d.size()), want_lse(lse.size());
  Status st = fused::attention_forward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, out.view(),
                                       View::contiguous(lse.data(), DType::kF64, pr.lse_shape()));
  ASSERT_TRUE(st.ok()) << st.message();
  st = reference::attention_forward(pr.p, pr.q.view64(), pr.k.view64(), pr.v.view64(), t64,
                                    View::contiguous(want.data(), DType::kF64, pr.q.shape),
                                    View::contiguous(want_lse.data(), DType::kF64, pr.lse_shape()));
  ASSERT_TRUE(st.ok()) << st.message();
  const Tol to = tol_out(dt), tg = tol_grad(dt);
  EXPECT_TRUE(Close(out.values(), want, to.atol, to.rtol)) << "out";
  // lse is float32 inside the kernel: absolute error ~ eps·|lse| plus the logits' error
  EXPECT_TRUE(AllClose(lse, want_lse, 1e-4, 1e-4)) << "lse";
  // backward
  Tensor dq = filled(dt, pr.q.shape), dk = filled(dt, pr.k.shape), dv = filled(dt, pr.v.shape);
  Tensor de = filled(pr.table.dtype, pr.table.shape);
  Vec wq(pr.q.d.size()), wk(pr.k.d.size()), wv(pr.v.d.size()), we(pr.table.d.size());
  EncodingGrads g, gw;
  g.table = de.view();
  gw.table = View::contiguous(we.data(), DType::kF64, pr.table.shape);
  st = fused::attention_backward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, pr.dout.view(),
                                 dq.view(), dk.view(), dv.view(), g);
  ASSERT_TRUE(st.ok()) << st.message();
  st = reference::attention_backward(
      pr.p, pr.q.view64(), pr.k.view64(), pr.v.view64(), t64, pr.dout.view64(),
      View::contiguous(wq.data(), DType::kF64, pr.q.shape),
      View::contiguous(wk.data(), DType::kF64, pr.k.shape),
      View::contiguous(wv.data(), DType::kF64, pr.v.shape), gw);
  ASSERT_TRUE(st.ok()) << st.message();
  // A gradient can vanish exactly: with one key, P = 1 and dl = dp − Δ = 0, so dq, dk and dtable are
  // 0 while float32 computes dp and Δ = Σ dout·out apart and leaves rounding noise; with npos = 1
  // every row's Σ_j dl_ij is 0; dtable cancels partly when most keys are clamped into one row. So
  // each gradient is measured against the scale of all of them, max(|dq|, |dk|, |dv|, |dtable|).
  const double g_scale = std::max({amax(wq), amax(wk), amax(wv), amax(we)});
  EXPECT_TRUE(AllClose(dq.values(), wq, tg.atol * g_scale, tg.rtol)) << "dq";
  EXPECT_TRUE(AllClose(dk.values(), wk, tg.atol * g_scale, tg.rtol)) << "dk";
  EXPECT_TRUE(AllClose(dv.values(), wv, tg.atol * g_scale, tg.rtol)) << "dv";
  EXPECT_TRUE(AllClose(de.values(), we, tg.atol * g_scale, tg.rtol)) << "dtable";
}

// check() with the stored backward (taken where it fits: the default) and with the one that runs
// the forward again (attention_cope_backward_stored.cc, attention_cope_backward.cc).
void check_both_paths(Problem& pr) {
  for (bool stored : {true, false}) {
    SCOPED_TRACE(stored ? "stored backward" : "recomputing backward");
    const fused::ScoreStoreLimit limit(stored ? -1 : 0);
    check(pr);
  }
}

TEST(FastCope, MatchesReference) {
  set_num_threads(1);
  int n = 0;
  for (const NamedCase& nc : fast_testing::shapes())
    for (bool causal : {false, true})
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        if (dt != DType::kF32 && nc.s.D == 130) continue;  // 16-bit on the smaller shapes suffices
        for (I npos : {I{1}, I{2}, I{5}, I{64}, I{300}}) {
          const DType tdt = ++n % 2 ? DType::kF64 : DType::kF32;
          SCOPED_TRACE(std::string(nc.name) + (causal ? " causal " : " full ") + dtype_name(dt) +
                       " npos " + std::to_string(npos) + " table " + dtype_name(tdt));
          Problem pr(nc.s, causal, npos, dt, tdt, 100 + n);
          check_both_paths(pr);
        }
      }
  set_num_threads(0);
}

// Sparse gates (logits centred near −4: gates mostly ~0.02): counts grow slowly, so rows stay unclamped over many
// keys and most keys leave every lane's ⌊p⌋ where it was (the kernels then reuse the table values).
TEST(FastCope, SparseGates) {
  set_num_threads(1);
  int n = 0;
  for (bool causal : {false, true})
    for (I npos : {I{3}, I{64}}) {
      ++n;
      SCOPED_TRACE(std::string(causal ? "causal" : "full") + " npos " + std::to_string(npos));
      Problem pr({1, 131, 400, 2, 1, 16}, causal, npos, DType::kF32, DType::kF64, 1500 + n, 4.0);
      check_both_paths(pr);
    }
  set_num_threads(0);
}

// Two threads: against the reference, and equal to one thread (tasks partition the work; only
// dtable sums per-thread partials, in double), on either backward path.
TEST(FastCope, TwoThreads) {
  const Case c{2, 130, 130, 4, 2, 64};  // B·Hq·M·N above the kernels' one-thread threshold
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Problem pr(c, causal, 64, DType::kF32, DType::kF64, 900);
    set_num_threads(2);
    check_both_paths(pr);
    for (bool stored : {true, false}) {
      SCOPED_TRACE(stored ? "stored backward" : "recomputing backward");
      const fused::ScoreStoreLimit limit(stored ? -1 : 0);
      std::vector<Vec> res[2];
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        Tensor out(DType::kF32, pr.q.shape), dq(DType::kF32, pr.q.shape), dk(DType::kF32, pr.k.shape),
            dv(DType::kF32, pr.v.shape), de(DType::kF64, pr.table.shape);
        EncodingGrads g;
        g.table = de.view();
        const EncodingTensors t = pr.tensors();
        const View qv = pr.q.view(), kv = pr.k.view(), vv = pr.v.view();
        ASSERT_TRUE(fused::attention_forward(pr.p, qv, kv, vv, t, out.view()).ok());
        ASSERT_TRUE(fused::attention_backward(pr.p, qv, kv, vv, t, pr.dout.view(), dq.view(),
                                              dk.view(), dv.view(), g).ok());
        res[threads - 1] = {out.values(), dq.values(), dk.values(), dv.values(), de.values()};
      }
      for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(res[0][i], res[1][i]) << "output " << i;
      EXPECT_TRUE(AllClose(res[1][4], res[0][4], 0, 1e-12)) << "dtable";
    }
  }
  set_num_threads(0);
}

// The stored backward is taken where it fits: its dv equals the recomputing backward's bit for bit
// (the same P, summed in the same order while the query rows make one chunk) and its dk does not
// (D = Σ P·dP rounds otherwise than dO·out), causal or not.
TEST(FastCope, StoredBackwardTakenWhereItFits) {
  set_num_threads(1);
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Problem pr({1, 300, 300, 2, 1, 32}, causal, 16, DType::kF32, DType::kF32, 1800);
    std::vector<Vec> res[2];
    for (int stored : {1, 0}) {
      const fused::ScoreStoreLimit limit(stored ? -1 : 0);
      Tensor dk(DType::kF32, pr.k.shape), dv(DType::kF32, pr.v.shape);
      ASSERT_TRUE(fused::attention_backward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), pr.tensors(),
                                            pr.dout.view(), View{}, dk.view(), dv.view(), EncodingGrads{})
                      .ok());
      res[stored] = {dk.values(), dv.values()};
    }
    EXPECT_NE(res[1][0], res[0][0]) << "dk";
    EXPECT_EQ(res[1][1], res[0][1]) << "dv";
  }
  set_num_threads(0);
}

// Every SIMD target compiled and supported here, on shapes that run every tile path: three key
// blocks, a whole query block and a partial one, rows whose counts saturate (npos = 5: forward
// tiles wholly clamped, backward tiles left of every j*; causal, with masked keys in the diagonal
// tiles, and not) and rows that never clamp (npos = 300).
TEST(FastCope, EveryTarget) {
  set_num_threads(1);
  int n = 0;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const auto& [causal, npos] : {std::pair{true, 5}, std::pair{false, 300}, std::pair{false, 5}}) {
      ++n;
      SCOPED_TRACE(std::string(hwy::TargetName(target)) + (causal ? " causal" : " full") + " npos " +
                   std::to_string(npos));
      Problem pr({1, 131, 260, 2, 1, 32}, causal, npos, DType::kF32, DType::kF32, 1000 + n);
      check_both_paths(pr);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  set_num_threads(0);
}

// A large case: several query and key blocks, counts saturating early in every row.
TEST(FastCope, L989MatchesReference) {
  set_num_threads(2);
  Problem pr({1, 989, 989, 2, 1, 64}, true, 64, DType::kF32, DType::kF32, 1200);
  check_both_paths(pr);
  set_num_threads(0);
}

// The backward's pass 2 walks each task's query rows in chunks (a few MiB of rows; here forced to
// 128 and to 100 rows, so that M = 389 crosses four, the last partial, and with 100 the query blocks
// sit off the 128-row grid): the per-row carries and C restart with each chunk, dK and dV of a key
// block are summed over the chunks that see it (in place for float32 outputs, in float32 split
// between the output and a buffer of low halves, rounded once, for bfloat16). Causal or not,
// grouped-query heads, float32 and bfloat16; M = N, M > N (early causal rows see nothing) and
// M < N with q_off = 0 (causal: the last keys are seen by no chunk and get 0). Against the reference with every output; then every other subset of dq, dk, dv
// and dtable, and float32 dk, dv with strides, give the same values bit for bit.
TEST(FastCope, ChunkedBackward) {
  const fused::ScoreStoreLimit recompute(0);  // chunks are the recomputing backward's
  set_num_threads(1);
  const NamedCase shapes[] = {
      {"M_eq_N", {1, 389, 389, 4, 2, 16}},
      {"M_gt_N", {1, 389, 200, 4, 2, 8}},
      {"M_lt_N_q0", {2, 300, 389, 2, 1, 8, I{0}, 0}},
  };
  int n = 0;
  for (I rows : {I{128}, I{100}})
    for (const NamedCase& nc : shapes)
      for (bool causal : {true, false})
        for (DType dt : {DType::kF32, DType::kBF16}) {
          ++n;
          const I npos = n % 2 ? 5 : 64;
          SCOPED_TRACE(std::string(nc.name) + " chunk " + std::to_string(rows) +
                       (causal ? " causal " : " full ") + dtype_name(dt) + " npos " +
                       std::to_string(npos));
          fused::cope_set_chunk_rows(rows);
          Problem pr(nc.s, causal, npos, dt, DType::kF32, 1600 + n);
          check(pr);
          // every output, then each subset: the outputs present are unchanged
          const EncodingTensors t = pr.tensors();
          const View qv = pr.q.view(), kv = pr.k.view(), vv = pr.v.view();
          auto run = [&](int mask, std::vector<Vec>* res) {
            Tensor dq = filled(dt, pr.q.shape), dk = filled(dt, pr.k.shape),
                   dv = filled(dt, pr.v.shape), de = filled(DType::kF32, pr.table.shape);
            EncodingGrads g;
            if (mask & 8) g.table = de.view();
            const Status st = fused::attention_backward(
                pr.p, qv, kv, vv, t, pr.dout.view(), mask & 1 ? dq.view() : View{},
                mask & 2 ? dk.view() : View{}, mask & 4 ? dv.view() : View{}, g);
            ASSERT_TRUE(st.ok()) << st.message();
            *res = {dq.values(), dk.values(), dv.values(), de.values()};
          };
          std::vector<Vec> all;
          run(15, &all);
          for (int mask = 1; mask < 15; ++mask) {
            std::vector<Vec> part;
            run(mask, &part);
            for (int o = 0; o < 4; ++o)
              if (mask & (1 << o)) {
                EXPECT_EQ(part[ix(o)], all[ix(o)]) << "mask " << mask << " output " << o;
              }
          }
          if (dt != DType::kF32) continue;
          // float32 dk, dv every other element of a buffer twice the size (add_rows with a stride)
          const I nkv = static_cast<I>(pr.k.d.size());
          std::vector<float> sk(ix(2 * nkv), 7.f), sv(ix(2 * nkv), 7.f);
          auto strided = [&](std::vector<float>& buf) {
            View w = View::contiguous(buf.data(), DType::kF32, pr.k.shape);
            for (int a = 0; a < 4; ++a) w.strides[ix(a)] *= 2;
            return w;
          };
          ASSERT_TRUE(fused::attention_backward(pr.p, qv, kv, vv, t, pr.dout.view(), View{},
                                                strided(sk), strided(sv), EncodingGrads{}).ok());
          Vec gk(ix(nkv)), gv(ix(nkv));
          for (I x = 0; x < nkv; ++x) gk[ix(x)] = sk[ix(2 * x)], gv[ix(x)] = sv[ix(2 * x)];
          EXPECT_EQ(gk, all[1]) << "strided dk";
          EXPECT_EQ(gv, all[2]) << "strided dv";
        }
  fused::cope_set_chunk_rows(0);
  set_num_threads(0);
}

// A bfloat16 or float16 dk, dv summed over several chunks keeps each float32 sum split between the
// output's own elements (high halves) and a buffer of low halves, and rounds it once at the end: bit
// for bit the rounding of what float32 inputs holding the same values give (the tiles are float32
// either way, and a float32 dk, dv sums the same parts in place, in the same order). One and two
// threads (each thread has its own buffer), causal and not, grouped-query heads, chunks of 100 rows.
TEST(FastCope, ChunkedSixteenBitSumsRoundOnce) {
  const fused::ScoreStoreLimit recompute(0);
  fused::cope_set_chunk_rows(100);
  auto run = [](Problem& x, DType dt, std::vector<Vec>* res) {
    Tensor dq = filled(dt, x.q.shape), dk = filled(dt, x.k.shape), dv = filled(dt, x.v.shape),
           de = filled(DType::kF32, x.table.shape);
    EncodingGrads g;
    g.table = de.view();
    const Status st = fused::attention_backward(x.p, x.q.view(), x.k.view(), x.v.view(), x.tensors(),
                                                x.dout.view(), dq.view(), dk.view(), dv.view(), g);
    ASSERT_TRUE(st.ok()) << st.message();
    *res = {dq.values(), dk.values(), dv.values(), de.values()};
  };
  int n = 0;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const auto rounded = [dt](double x) {
      const float f = static_cast<float>(x);
      return dt == DType::kBF16 ? to_float(to_bf16(f)) : to_float(to_f16(f));
    };
    for (int threads : {1, 2})
      for (bool causal : {true, false}) {
        ++n;
        SCOPED_TRACE(std::string(dtype_name(dt)) + ", " + std::to_string(threads) +
                     (causal ? " threads causal" : " threads full"));
        set_num_threads(threads);
        Problem pr({2, 389, 389, 4, 2, 16}, causal, 16, dt, DType::kF32, 1700 + n);
        Problem wide = pr;
        for (auto [to, from] : {std::pair{&wide.q, &pr.q}, std::pair{&wide.k, &pr.k},
                                std::pair{&wide.v, &pr.v}, std::pair{&wide.dout, &pr.dout}})
          *to = Tensor(DType::kF32, from->values(), from->shape);
        std::vector<Vec> half, full;
        run(pr, dt, &half);
        run(wide, DType::kF32, &full);
        for (int o = 0; o < 3; ++o) {
          ASSERT_EQ(half[ix(o)].size(), full[ix(o)].size());
          std::size_t differ = 0;
          for (std::size_t i = 0; i < full[ix(o)].size(); ++i)
            differ += half[ix(o)][i] != rounded(full[ix(o)][i]);
          EXPECT_EQ(differ, 0u) << "output " << o << " (dq, dk, dv)";
        }
        EXPECT_EQ(half[3], full[3]) << "dtable";
      }
  }
  fused::cope_set_chunk_rows(0);
  set_num_threads(0);
}

// Peak memory grows by O(L·(D + ncol)), never by an L×L buffer: L = 4096 (an L×L float buffer is
// 64 MiB; the kernel's buffers here are ~0.7 MiB). The process's peak is reset first.
long status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::string(key).size()));
  return -1;
}

TEST(FastCope, LongSequenceNeedsNoLxLBuffer) {
  set_num_threads(1);
  Problem pr({1, 4096, 4096, 1, 1, 4}, true, 16, DType::kF32, DType::kF32, 1300);
  Tensor out(DType::kF32, pr.q.shape), dq(DType::kF32, pr.q.shape), dk(DType::kF32, pr.k.shape),
      dv(DType::kF32, pr.v.shape), de(DType::kF32, pr.table.shape);
  EncodingGrads g;
  g.table = de.view();
  std::ofstream clear("/proc/self/clear_refs");
  if (!clear || !(clear << "5").flush())
    GTEST_SKIP() << "cannot reset the peak (/proc/self/clear_refs)";
  clear.close();
  const long before = status_kb("VmRSS:");
  ASSERT_TRUE(fused::attention_forward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), pr.tensors(),
                                       out.view()).ok());
  ASSERT_TRUE(fused::attention_backward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), pr.tensors(),
                                        pr.dout.view(), dq.view(), dk.view(), dv.view(), g).ok());
  const long peak = status_kb("VmHWM:");
  if (before < 0 || peak < 0) GTEST_SKIP() << "no /proc/self/status";
  EXPECT_LT(peak - before, 16 * 1024) << "peak grew by " << (peak - before) << " kB";
  // first row sees only key 0 (p = g_00 < 1 unclamped): out_0 = v_0
  for (I e = 0; e < 4; ++e) EXPECT_NEAR(out.f[ix(e)], pr.v.f[ix(e)], 1e-6);
  set_num_threads(0);
}

// The dispatcher: large enough problems run the fused kernel (bit for bit), calls of M ≤ 16 queries
// the decode kernel, other small ones the reference.
TEST(FastCope, PublicEntryPointsPickTheKernelOrTheReference) {
  for (I L : {I{4}, I{20}, I{200}}) {
    Problem pr({1, L, L, 1, 1, 16}, true, 8, DType::kF32, DType::kF32, 1400);
    const EncodingTensors t = pr.tensors();
    Tensor a(DType::kF32, pr.q.shape), b(DType::kF32, pr.q.shape);
    const View qv = pr.q.view(), kv = pr.k.view(), vv = pr.v.view();
    ASSERT_TRUE(attention_forward(pr.p, qv, kv, vv, t, a.view()).ok());
    const Status st = L == 4    ? decode::attention_forward(pr.p, qv, kv, vv, t, b.view())
                      : L == 20 ? reference::attention_forward(pr.p, qv, kv, vv, t, b.view())
                                : fused::attention_forward(pr.p, qv, kv, vv, t, b.view());
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(a.values(), b.values()) << "L = " << L;
  }
}

}  // namespace
}  // namespace posenc
