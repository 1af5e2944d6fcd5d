// The fused Transformer-XL attention, posenc::fused:: (src/attention/attention_xl_cpu.cc), against the
// plain reference posenc::reference:: (src/attention/attention_ref.cc): forward (out, lse) and backward
// (dq, dk, dv, du, dv_bias, drel_proj) × causal or not × M = N, decode (M = 1), M < N, M > N ×
// grouped-query heads × global offsets (queries near their keys or far from them) × float32,
// bfloat16 and float16 × sizes off the tile (L ∈ {1, 3, 19, 130}, D ∈ {2, 6, 64, 130},
// R ∈ {2, 8, 64}) × 1 and 2 threads; a large case (L = 989); every SIMD target on a mid-size case;
// two threads bit for bit equal to one; a long case (L = 8192) whose peak memory shows no L×L
// buffer; the dispatcher's choice.
//
// The reference sees exactly what the kernel reads: q/k/v are rounded to the dtype first, and the
// encoding tensors (u, v, W: float64 or float32 views, alternating over the cases) are the same views.
// Tolerances: |got − want| ≤ atol + rtol·|want|, atol scaled by the largest |want| of the tensor; they
// are attention_fast_testing.h's (the kernel's arithmetic is the same float32 sgemm tiles; the
// position term widens the score product's inner dimension by R, and float32 sin/cos tables).
#include <hwy/targets.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention_decode.h"
#include "attention/attention_fused.h"
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

struct Shape {
  const char* name;
  I B, M, N, Hq, Hkv, D, R;
  std::optional<I> q_off = std::nullopt;
  I k_off = 0;
};

std::vector<Shape> shapes() {
  return {
      {"L1", 1, 1, 1, 2, 1, 2, 2},
      {"L3_B2", 2, 3, 3, 2, 2, 6, 8},
      {"L19_gqa", 1, 19, 19, 4, 2, 64, 64},
      {"L130_d6", 1, 130, 130, 2, 1, 6, 8},
      {"decode", 1, 1, 130, 4, 2, 64, 64},
      {"mqa_decode", 1, 1, 70, 5, 1, 8, 8},  // a kv group of 5 heads in one tile
      {"M_lt_N_d130", 1, 19, 130, 2, 2, 130, 2},
      {"M_gt_N", 1, 130, 19, 2, 1, 6, 8},  // default q_off = N − M < 0: early causal rows see nothing
      {"offsets", 2, 19, 37, 2, 1, 6, 8, I{960}, I{955}},
      {"far", 1, 3, 130, 2, 2, 6, 64, I{1000003}, I{1000000}},
      {"apart", 1, 19, 37, 2, 1, 6, 8, I{5000}, I{0}},  // queries far past the keys: two table ranges
  };
}

struct Tol {
  double atol, rtol;  // atol relative to the tensor's largest |want|
};
Tol tol_out(DType t) { return t == DType::kF32 ? Tol{2e-6, 2e-5} : Tol{8e-3, 8e-3}; }
Tol tol_grad(DType t) { return t == DType::kF32 ? Tol{2e-5, 1e-4} : Tol{1.6e-2, 1.6e-2}; }
// Parameter gradients sum over every (i, j) pair, with cancellation: relative to the largest entry.
// Their own outputs are float32/64 and the reference sees the rounded inputs, so bfloat16 storage
// adds no error of its own: the kernel's float32 sums over a tile, summed across tiles in double
// (measured: at most a twentieth of this tolerance over these cases).
Tol tol_param(DType) { return Tol{2e-5, 2e-4}; }

double amax(const Vec& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::isfinite(v) ? std::fabs(v) : 0.0);
  return m;
}
::testing::AssertionResult Close(const Vec& got, const Vec& want, Tol t) {
  return AllClose(got, want, t.atol * std::max(amax(want), 1e-30), t.rtol);
}

// One problem: inputs in dtype dt, the encoding tensors in `enc` (float64 or float32).
struct Problem {
  Shape s;
  AttentionParams p;
  DType dt;
  Tensor q, k, v, dout, u, vb, w;

  Problem(const Shape& sh, bool causal, DType t, DType enc, std::uint64_t seed)
      : s(sh), dt(t),
        q(t, randn(ix(sh.B * sh.M * sh.Hq * sh.D), seed + 1), {sh.B, sh.M, sh.Hq, sh.D}),
        k(t, randn(ix(sh.B * sh.N * sh.Hkv * sh.D), seed + 2), {sh.B, sh.N, sh.Hkv, sh.D}),
        v(t, randn(ix(sh.B * sh.N * sh.Hkv * sh.D), seed + 3), {sh.B, sh.N, sh.Hkv, sh.D}),
        dout(t, randn(ix(sh.B * sh.M * sh.Hq * sh.D), seed + 4), {sh.B, sh.M, sh.Hq, sh.D}),
        u(enc, randn(ix(sh.Hq * sh.D), seed + 5, 0.5), {sh.Hq, sh.D}),
        vb(enc, randn(ix(sh.Hq * sh.D), seed + 6, 0.5), {sh.Hq, sh.D}),
        w(enc, randn(ix(sh.Hq * sh.D * sh.R), seed + 7, 0.5), {sh.Hq, sh.D, sh.R}) {
    p.encoding = Encoding::kXL;
    p.causal = causal;
    p.q_offset = sh.q_off;
    p.k_offset = sh.k_off;
  }
  EncodingTensors tensors() {
    EncodingTensors t;
    t.u = u.view();
    t.v = vb.view();
    t.rel_proj = w.view();
    return t;
  }
  std::vector<I> qshape() const { return {s.B, s.M, s.Hq, s.D}; }
  std::vector<I> kshape() const { return {s.B, s.N, s.Hkv, s.D}; }
};

// Forward and backward of the fused kernel against the reference; gradients of the encoding
// tensors in `gdt` (float64 or float32).
void check(Problem& pr, DType gdt) {
  const Shape& s = pr.s;
  const EncodingTensors t = pr.tensors();
  // forward
  Tensor out(pr.dt, pr.qshape());
  Vec lse(ix(s.B * s.Hq * s.M), 7.0), want(pr.q.d.size()), want_lse(lse.size());
  const std::vector<I> lshape = {s.B, s.Hq, s.M};
  Status st = fused::attention_forward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, out.view(),
                                       View::contiguous(lse.data(), DType::kF64, lshape));
  ASSERT_TRUE(st.ok()) << st.message();
  st = reference::attention_forward(pr.p, pr.q.view64(), pr.k.view64(), pr.v.view64(), t,
                                    View::contiguous(want.data(), DType::kF64, pr.qshape()),
                                    View::contiguous(want_lse.data(), DType::kF64, lshape));
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(Close(out.values(), want, tol_out(pr.dt))) << "out";
  EXPECT_TRUE(AllClose(lse, want_lse, 1e-4, 1e-5)) << "lse";

  // backward
  Tensor dq(pr.dt, pr.qshape()), dk(pr.dt, pr.kshape()), dv(pr.dt, pr.kshape());
  Tensor du(gdt, Vec(pr.u.d.size(), 9.0), pr.u.shape), dvb(gdt, Vec(pr.vb.d.size(), 9.0), pr.vb.shape),
      dw(gdt, Vec(pr.w.d.size(), 9.0), pr.w.shape);
  EncodingGrads g;
  g.u = du.view();
  g.v = dvb.view();
  g.rel_proj = dw.view();
  st = fused::attention_backward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, pr.dout.view(),
                                 dq.view(), dk.view(), dv.view(), g);
  ASSERT_TRUE(st.ok()) << st.message();
  Vec wq(pr.q.d.size()), wk(pr.k.d.size()), wv(pr.v.d.size()), wu(pr.u.d.size()),
      wvb(pr.vb.d.size()), ww(pr.w.d.size());
  EncodingGrads gw;
  gw.u = View::contiguous(wu.data(), DType::kF64, pr.u.shape);
  gw.v = View::contiguous(wvb.data(), DType::kF64, pr.vb.shape);
  gw.rel_proj = View::contiguous(ww.data(), DType::kF64, pr.w.shape);
  st = reference::attention_backward(
      pr.p, pr.q.view64(), pr.k.view64(), pr.v.view64(), t, pr.dout.view64(),
      View::contiguous(wq.data(), DType::kF64, pr.qshape()),
      View::contiguous(wk.data(), DType::kF64, pr.kshape()),
      View::contiguous(wv.data(), DType::kF64, pr.kshape()), gw);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(Close(dq.values(), wq, tol_grad(pr.dt))) << "dq";
  EXPECT_TRUE(Close(dk.values(), wk, tol_grad(pr.dt))) << "dk";
  EXPECT_TRUE(Close(dv.values(), wv, tol_grad(pr.dt))) << "dv";
  EXPECT_TRUE(Close(du.values(), wu, tol_param(pr.dt))) << "du";
  EXPECT_TRUE(Close(dvb.values(), wvb, tol_param(pr.dt))) << "dv_bias";
  EXPECT_TRUE(Close(dw.values(), ww, tol_param(pr.dt))) << "drel_proj";
}

// check() with the stored backward (taken where it fits: the default) and with the one that runs the
// forward again (attention_xl_backward_stored.cc, attention_xl_backward.cc).
void check_both_paths(Problem& pr, DType gdt) {
  for (bool stored : {true, false}) {
    SCOPED_TRACE(stored ? "stored backward" : "recomputing backward");
    const fused::ScoreStoreLimit limit(stored ? -1 : 0);
    check(pr, gdt);
  }
}

TEST(FastAttentionXL, MatchesReferenceEveryShape) {
  int n = 0;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const Shape& s : shapes())
      for (bool causal : {false, true})
        for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
          if (dt != DType::kF32 && (s.D == 130 || threads == 2)) continue;  // 16-bit on the rest suffices
          ++n;
          const DType enc = n % 2 ? DType::kF64 : DType::kF32, gdt = n % 3 ? DType::kF64 : DType::kF32;
          SCOPED_TRACE(std::string(s.name) + (causal ? " causal " : " full ") + dtype_name(dt) +
                       " threads " + std::to_string(threads) + " enc " + dtype_name(enc) + " grads " +
                       dtype_name(gdt));
          Problem pr(s, causal, dt, enc, 100 + 10 * n);
          check_both_paths(pr, gdt);
        }
  }
  set_num_threads(0);
}

// A large case: many tiles, both masks' tile classes, GQA.
TEST(FastAttentionXL, L989MatchesReference) {
  set_num_threads(2);
  Problem pr({"L989", 1, 989, 989, 2, 1, 64, 64}, true, DType::kF32, DType::kF64, 600);
  check_both_paths(pr, DType::kF64);
  set_num_threads(0);
}

// Every SIMD target the row helpers were compiled for, on a mid-size case.
TEST(FastAttentionXL, EverySimdTarget) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    Problem pr({"mid", 1, 150, 140, 2, 1, 64, 16, I{20}, I{3}}, true, DType::kF32, DType::kF64, 700);
    check_both_paths(pr, DType::kF64);
  }
  hwy::SetSupportedTargetsForTest(0);
}

// With no buffer kept for speed (as for a call too large to keep them): each key block's Cᵀ
// transposed from the table, each backward tile's [Q + u | Ỹ] formed again, dQ summed in dq itself.
// Causal with offsets (tiles not aligned to the query blocks) and full with GQA and two batch rows.
TEST(FastAttentionXL, UncachedPathsMatchReference) {
  const fused::ScoreStoreLimit recompute(0);  // the buffers are the recomputing backward's
  fused::xl_set_cache_limit(0);
  fused::set_dq_buffer_limit(0);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Problem a({"mid", 1, 150, 140, 2, 1, 64, 16, I{20}, I{3}}, true, DType::kF32, DType::kF64, 1100);
    check(a, DType::kF64);
    Problem b({"two", 2, 200, 200, 4, 2, 64, 64}, false, DType::kF32, DType::kF64, 1200);
    check(b, DType::kF64);
  }
  set_num_threads(0);
  fused::xl_set_cache_limit(-1);
  fused::set_dq_buffer_limit(-1);
}

// Two threads compute exactly what one does (tasks partition the work; sums run in a fixed order).
// A decode step stacks a kv group's heads in a tile, cut into parts where there are more threads than
// groups: each head's row is the same however its group is cut.
TEST(FastAttentionXL, DecodeStepSameHoweverTheGroupIsCut) {
  // 7 heads · 5000 keys: past fast::kParallelMin, so the threads are used (parts of 7; 4 + 3; 3 + 3 + 1)
  Problem pr({"mqa", 1, 1, 5000, 7, 1, 16, 8}, true, DType::kF32, DType::kF64, 1400);
  const EncodingTensors t = pr.tensors();
  std::vector<Vec> res;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor out(DType::kF32, pr.qshape());
    Vec lse(7);
    ASSERT_TRUE(fused::attention_forward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, out.view(),
                                         View::contiguous(lse.data(), DType::kF64, {1, 7, 1}))
                    .ok());
    res.push_back(out.values());
    res.push_back(lse);
  }
  set_num_threads(0);
  for (std::size_t i = 2; i < res.size(); ++i) EXPECT_EQ(res[i % 2], res[i]) << "run " << i / 2;
}

TEST(FastAttentionXL, TwoThreadsEqualOne) {
  for (bool stored : {true, false}) {
    SCOPED_TRACE(stored ? "stored backward" : "recomputing backward");
    const fused::ScoreStoreLimit limit(stored ? -1 : 0);
    Problem pr({"two", 2, 200, 200, 4, 2, 64, 64}, false, DType::kF32, DType::kF64, 800);
    const EncodingTensors t = pr.tensors();
    std::vector<Vec> res[2];
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Tensor out(DType::kF32, pr.qshape()), dq(DType::kF32, pr.qshape()), dk(DType::kF32, pr.kshape()),
          dv(DType::kF32, pr.kshape()), du(DType::kF64, pr.u.shape), dvb(DType::kF64, pr.vb.shape),
          dw(DType::kF64, pr.w.shape);
      EncodingGrads g;
      g.u = du.view();
      g.v = dvb.view();
      g.rel_proj = dw.view();
      ASSERT_TRUE(fused::attention_forward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, out.view()).ok());
      ASSERT_TRUE(fused::attention_backward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t,
                                            pr.dout.view(), dq.view(), dk.view(), dv.view(), g).ok());
      res[threads - 1] = {out.values(), dq.values(), dk.values(), dv.values(),
                          du.values(),  dvb.values(), dw.values()};
    }
    set_num_threads(0);
    for (std::size_t i = 0; i < res[0].size(); ++i) EXPECT_EQ(res[0][i], res[1][i]) << "output " << i;
  }
}

// The stored backward is taken where it fits: a causal first row sees only key 0, so P = 1 and the
// stored path's D = Σ P·dP is dP itself, dS exactly 0 and that row's dq exactly 0; computing the
// forward again gives D = dO·out, which rounds otherwise and leaves a few ulps.
TEST(FastAttentionXL, StoredBackwardTakenWhereItFits) {
  set_num_threads(1);
  Problem pr({"first", 1, 200, 200, 2, 1, 64, 16}, true, DType::kF32, DType::kF64, 1500);
  const EncodingTensors t = pr.tensors();
  Vec row0[2];
  for (int stored : {0, 1}) {
    const fused::ScoreStoreLimit limit(stored ? -1 : 0);
    Tensor dq(DType::kF32, pr.qshape());
    ASSERT_TRUE(fused::attention_backward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, pr.dout.view(),
                                          dq.view(), View{}, View{}, EncodingGrads{}).ok());
    const Vec all = dq.values();
    row0[stored].assign(all.begin(), all.begin() + 64);  // row 0 of head 0
  }
  EXPECT_EQ(row0[1], Vec(64, 0.0));
  EXPECT_NE(row0[0], Vec(64, 0.0));
  set_num_threads(0);
}

// attention_backward_saved given the public forward's out and lse: the public backward's gradients,
// bit for bit with float32 out where that runs the forward again (pass 1 reads out and lse instead),
// within 1e-5 of each output's largest entry where it takes the stored path (D = Σ P·dP rounds
// otherwise), at a size the dispatcher sends to the kernel and at one it sends to the reference; with
// bfloat16 out (Δ from the rounded out), within the kernel's bfloat16 gradient tolerance of the
// float64 reference.
TEST(FastAttentionXL, SavedForwardGivesTheSameBackward) {
  for (bool stored : {false, true})
    for (DType dt : {DType::kF32, DType::kBF16})
      for (I L : {I{4}, I{200}}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " L = " + std::to_string(L) + (stored ? " stored" : ""));
        const fused::ScoreStoreLimit limit(stored ? -1 : 0);
        Problem pr({"saved", 1, L, L, 4, 2, 64, 16}, true, dt, DType::kF64, 1300);
        const EncodingTensors t = pr.tensors();
        Tensor out(dt, pr.qshape());
        Vec lse(ix(4 * L));
        const View lv = View::contiguous(lse.data(), DType::kF64, {1, 4, L});
        ASSERT_TRUE(attention_forward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, out.view(), lv).ok());
        std::vector<Vec> res[2];
        for (int saved : {0, 1}) {
          Tensor dq(dt, pr.qshape()), dk(dt, pr.kshape()), dv(dt, pr.kshape()), du(DType::kF64, pr.u.shape),
              dvb(DType::kF64, pr.vb.shape), dw(DType::kF64, pr.w.shape);
          EncodingGrads g;
          g.u = du.view();
          g.v = dvb.view();
          g.rel_proj = dw.view();
          const Status st =
              saved ? attention_backward_saved(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, out.view(), lv,
                                               pr.dout.view(), dq.view(), dk.view(), dv.view(), g)
                    : attention_backward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, pr.dout.view(),
                                         dq.view(), dk.view(), dv.view(), g);
          ASSERT_TRUE(st.ok()) << st.message();
          res[saved] = {dq.values(), dk.values(), dv.values(), du.values(), dvb.values(), dw.values()};
        }
        if (dt == DType::kF32) {
          for (std::size_t i = 0; i < res[0].size(); ++i) {
            if (stored) {
              EXPECT_TRUE(Close(res[0][i], res[1][i], Tol{1e-5, 0})) << "output " << i;
            } else {
              EXPECT_EQ(res[0][i], res[1][i]) << "output " << i;
            }
          }
          continue;
        }
        Vec wq(pr.q.d.size()), wk(pr.k.d.size()), wv(pr.v.d.size()), wu(pr.u.d.size()), wvb(pr.vb.d.size()),
            ww(pr.w.d.size());
        EncodingGrads gw;
        gw.u = View::contiguous(wu.data(), DType::kF64, pr.u.shape);
        gw.v = View::contiguous(wvb.data(), DType::kF64, pr.vb.shape);
        gw.rel_proj = View::contiguous(ww.data(), DType::kF64, pr.w.shape);
        ASSERT_TRUE(reference::attention_backward(pr.p, pr.q.view64(), pr.k.view64(), pr.v.view64(), t,
                                                  pr.dout.view64(), View::contiguous(wq.data(), DType::kF64, pr.qshape()),
                                                  View::contiguous(wk.data(), DType::kF64, pr.kshape()),
                                                  View::contiguous(wv.data(), DType::kF64, pr.kshape()), gw)
                        .ok());
        // Δ from the rounded out carries bfloat16's error into every gradient, the parameters' too
        const Vec* want[] = {&wq, &wk, &wv, &wu, &wvb, &ww};
        for (std::size_t i = 0; i < 6; ++i) EXPECT_TRUE(Close(res[1][i], *want[i], tol_grad(dt))) << "output " << i;
      }
}

// kB of the process's peak resident memory (VmHWM).
long peak_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// L = 8192, one head, forward and backward: an L×L float buffer would be 256 MB; the kernel needs
// the angle table (L·R floats, 2 MB), per thread X̃ (L·R floats, 2 MB; dQ sums in dq), lse, D, and
// the key panels of the forward and of the backward's first pass (L·(D + R) floats and row padding,
// 4.7 MB each; under ASan's quarantine the second does not reuse the first's pages). The backward
// that computes the forward again: the stored path, which this size would take, adds its tiles and
// rows (22 MB here), bounded by score_store_limit a thread (attention_tiles.h).
TEST(FastAttentionXL, LongSequenceNeedsNoLxLBuffer) {
  const fused::ScoreStoreLimit recompute(0);
  const I L = 8192, D = 64, R = 64;
  set_num_threads(2);
  Problem pr({"long", 1, L, L, 1, 1, D, R}, true, DType::kF32, DType::kF32, 900);
  Tensor out(DType::kF32, Vec(ix(L * D), 1.0), pr.qshape());  // touched: counted before the call
  Tensor dq(DType::kF32, Vec(ix(L * D), 1.0), pr.qshape()), dk(DType::kF32, Vec(ix(L * D), 1.0), pr.kshape()),
      dv(DType::kF32, Vec(ix(L * D), 1.0), pr.kshape());
  const EncodingTensors t = pr.tensors();
  const long before = peak_kb();
  ASSERT_TRUE(attention_forward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, out.view()).ok());
  ASSERT_TRUE(attention_backward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, pr.dout.view(),
                                 dq.view(), dk.view(), dv.view(), {}).ok());
  const long after = peak_kb();
  set_num_threads(0);
  if (before < 0 || after < 0) GTEST_SKIP() << "no /proc/self/status";
  EXPECT_LT(after - before, 48 * 1024) << "peak grew by " << (after - before) << " kB";
  // the first row sees only key 0: out = v_0
  for (I e = 0; e < D; ++e) EXPECT_FLOAT_EQ(static_cast<float>(out.values()[ix(e)]), pr.v.f[ix(e)]);
}

// The dispatcher runs the fused kernel for a large enough xl problem (bit for bit), the decode
// kernel for one of M ≤ 16 queries, and the reference for a small one of more queries.
TEST(FastAttentionXL, PublicEntryPointsPickTheKernelOrTheReference) {
  for (I L : {I{4}, I{20}, I{200}}) {
    Problem pr({"dispatch", 1, L, L, 2, 1, 64, 8}, true, DType::kF32, DType::kF64, 1000);
    const EncodingTensors t = pr.tensors();
    Tensor a(DType::kF32, pr.qshape()), b(DType::kF32, pr.qshape());
    ASSERT_TRUE(attention_forward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, a.view()).ok());
    const Status st =
        L == 4    ? decode::attention_forward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, b.view())
        : L == 20 ? reference::attention_forward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, b.view())
                  : fused::attention_forward(pr.p, pr.q.view(), pr.k.view(), pr.v.view(), t, b.view());
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(a.values(), b.values()) << "L = " << L;
  }
}

}  // namespace
}  // namespace posenc
