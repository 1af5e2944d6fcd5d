// RoPE's fast path (rope_forward, rope_backward, rope_qk: Highway SIMD + OpenMP) against
// posenc::reference::, on every SIMD target compiled and supported here, for float32 / bfloat16 /
// float16 storage, odd sizes, strided and misaligned views, guard bands around outputs, in place,
// large positions, one and two threads, outputs large enough for the non-temporal stores, every
// frequency scheme and angle mode. The reference runs on the same 16-bit-rounded inputs; tolerances
// scale with dtype. Never times anything.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fast_elementwise_testing.h"

namespace posenc {
namespace {

using namespace ::posenc::fast_elementwise_testing;  // NOLINT: the fixtures of these tests

// ---- RoPE ----------------------------------------------------------------------------------------

struct RopeCase {
  std::int64_t B, L, H, D, r;
};
const RopeCase kRopeCases[] = {{1, 1, 1, 2, 0},   {2, 3, 2, 6, 4},    {1, 19, 3, 64, 0},
                               {2, 3, 2, 130, 0}, {1, 19, 2, 128, 64}, {1, 989, 1, 64, 0},
                               {2, 19, 2, 130, 66},
                               // Head dimensions whose tables cap a block of tokens (rope_cpu.cc's
                               // kBlockFloats): 4 tokens a block at D = 4096, 1 at D = 16384.
                               {1, 7, 1, 4096, 0}, {1, 3, 1, 16384, 16382}};

TEST(FastElementwiseRope, MatchesReferenceEveryTargetDtypeOption) {
  int n = 0;
  ForEachTarget([&](const std::string& target) {
    for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf})
      for (DType dt : kDtypes)
        for (const RopeCase& c : kRopeCases) {
          ++n;
          // Vary the options over the cases instead of taking their full product.
          const bool backward = n % 2 == 1, strided = n % 3 == 0, misaligned = n % 4 == 1,
                     in_place = n % 5 == 2, with_ids = n % 3 == 1;
          RopeParams p;
          p.layout = layout;
          p.rotary_dim = c.r;
          p.theta = n % 2 ? 10000.0 : 500000.0;
          const std::vector<std::int64_t> shape = {c.B, c.L, c.H, c.D};
          const std::vector<double> xs = randn(static_cast<std::size_t>(c.B * c.L * c.H * c.D), 100 + n);
          Buf x(dt, shape, strided, misaligned), y(dt, shape, !strided, !misaligned);
          Buf rx(dt, shape), ry(dt, shape);
          x.fill(xs);
          rx.fill(xs);
          std::vector<std::int32_t> ids(static_cast<std::size_t>(c.B * c.L));
          const std::vector<double> pr = random_positions(c.B * c.L, 7 + n, 3000.0);
          for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(pr[i]);
          Positions pos;
          if (with_ids) pos.ids = View::contiguous(ids.data(), DType::kI32, {c.B, c.L});
          pos.offset = with_ids ? 3 : 12345;
          const View& out = in_place ? x.v : y.v;
          const Status s = backward ? rope_backward(p, x.v, pos, out) : rope_forward(p, x.v, pos, out);
          const Status rs = backward ? reference::rope_backward(p, rx.v, pos, ry.v)
                                     : reference::rope_forward(p, rx.v, pos, ry.v);
          const std::string what = target + " " + rope_layout_name(layout) + " " + dtype_name(dt) + " case " +
                                   std::to_string(n) + " D=" + std::to_string(c.D);
          ExpectCallMatches(s, rs, what, dt, in_place, x, y, ry);
        }
  });
  EXPECT_GT(n, 0);
}

// What rope_apply_qk computes at once, by the reference: rope_forward (or rope_backward) of q into
// qo and of k into ko.
void ReferenceQk(const RopeParams& p, const Positions& pos, bool backward, const Buf& q, const Buf& k, const Buf& qo,
                 const Buf& ko) {
  const auto run = backward ? reference::rope_backward : reference::rope_forward;
  ASSERT_TRUE(run(p, q.v, pos, qo.v).ok());
  ASSERT_TRUE(run(p, k.v, pos, ko.v).ok());
}

TEST(FastElementwiseRope, QkInOneCallEqualsTwoReferenceCalls) {
  ForEachTarget([&](const std::string& target) {
    int n = 0;
    for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf})
      for (DType dt : kDtypes)
        for (bool backward : {false, true}) {
          ++n;
          const bool in_place = n % 2 == 0;
          RopeParams p;
          p.layout = layout;
          p.rotary_dim = n % 3 == 0 ? 32 : 0;
          const std::int64_t B = 2, L = 19, Hq = 4, Hk = 2, D = 64;
          const std::vector<double> qs = randn(static_cast<std::size_t>(B * L * Hq * D), 300 + n);
          const std::vector<double> ks = randn(static_cast<std::size_t>(B * L * Hk * D), 400 + n);
          Buf q(dt, {B, L, Hq, D}, true, true), k(dt, {B, L, Hk, D}, false, true);
          Buf qo(dt, {B, L, Hq, D}), ko(dt, {B, L, Hk, D}, true);
          Buf rq(dt, {B, L, Hq, D}), rk(dt, {B, L, Hk, D}), rqo(dt, {B, L, Hq, D}), rko(dt, {B, L, Hk, D});
          q.fill(qs);
          rq.fill(qs);
          k.fill(ks);
          rk.fill(ks);
          Positions pos;
          pos.offset = 1000 * n;
          const Status s = rope_apply_qk(p, q.v, k.v, pos, in_place ? q.v : qo.v, in_place ? k.v : ko.v, backward);
          ASSERT_TRUE(s.ok()) << s.message();
          ASSERT_NO_FATAL_FAILURE(ReferenceQk(p, pos, backward, rq, rk, rqo, rko));
          const Tol t = tol_for(dt);
          const std::string what = target + " " + dtype_name(dt) + " case " + std::to_string(n);
          EXPECT_TRUE(AllClose((in_place ? q : qo).values(), rqo.values(), t.atol, t.rtol)) << what;
          EXPECT_TRUE(AllClose((in_place ? k : ko).values(), rko.values(), t.atol, t.rtol)) << what;
          for (const Buf* b : {&q, &k, &qo, &ko}) EXPECT_TRUE(b->guards_ok()) << what;
        }
  });
}

TEST(FastElementwiseRope, QkValidatesLikeTheReference) {
  std::vector<float> q(2 * 3 * 2 * 8), k(2 * 4 * 2 * 8);
  const View qv = View::contiguous(q.data(), DType::kF32, {2, 3, 2, 8});
  const View kv = View::contiguous(k.data(), DType::kF32, {2, 4, 2, 8});
  const Status s = rope_apply_qk(RopeParams{}, qv, kv, Positions{}, qv, kv);
  EXPECT_EQ(s.arg(), "k");
  RopeParams odd;
  odd.rotary_dim = 3;
  EXPECT_EQ(rope_apply_qk(odd, qv, View{}, Positions{}, qv, View{}).arg(), "rotary_dim");
  EXPECT_EQ(rope_forward(odd, qv, Positions{}, qv).message(),
            reference::rope_forward(odd, qv, Positions{}, qv).message());
  const View bad = View::contiguous(q.data(), DType::kF32, {2, 3, 16});
  EXPECT_EQ(rope_forward(RopeParams{}, bad, Positions{}, bad).message(),
            reference::rope_forward(RopeParams{}, bad, Positions{}, bad).message());
}

// Each output may be its own input, never the other pair's memory: q_out on k (or partly on it),
// k_out on q or on q_out are errors naming the output, nothing written; views of no elements
// (wherever they point) overlap nothing.
TEST(FastElementwiseRope, QkOutputsOverlappingTheOtherPairAreErrors) {
  const std::int64_t n = 1 * 4 * 2 * 8;
  std::vector<float> q = testing::to_float(randn(static_cast<std::size_t>(n), 61)),
                     k = testing::to_float(randn(static_cast<std::size_t>(n), 62)), o(static_cast<std::size_t>(2 * n));
  const std::vector<float> q0 = q, k0 = k;
  const auto V = [](float* d) { return View::contiguous(d, DType::kF32, {1, 4, 2, 8}); };
  const View qv = V(q.data()), kv = V(k.data()), ov = V(o.data());
  const struct { View qo, ko; const char* arg; } bad[] = {
      {kv, ov, "q_out"}, {V(k.data() + 8), ov, "q_out"},  // q_out on k, partly on k
      {ov, qv, "k_out"}, {ov, ov, "k_out"}, {ov, V(o.data() + 8), "k_out"}};
  for (const auto& b : bad) {
    EXPECT_EQ(rope_apply_qk(RopeParams{}, qv, kv, Positions{}, b.qo, b.ko).arg(), b.arg);
    EXPECT_EQ(q, q0);
    EXPECT_EQ(k, k0);
  }
  EXPECT_TRUE(rope_apply_qk(RopeParams{}, qv, kv, Positions{}, qv, kv).ok());  // in place
  // a fused QKV's q and k (interleaved rows of one buffer) rotated in place: what rotating copies gives
  std::vector<float> qkv = testing::to_float(randn(static_cast<std::size_t>(3 * n), 63)), want_q(q.size()), want_k(k.size());
  const auto slice = [&](int part) {
    View v = View::contiguous(qkv.data() + part * 16, DType::kF32, {1, 4, 2, 8});
    v.strides[1] = 3 * 16;
    v.strides[0] = 4 * 3 * 16;
    return v;
  };
  std::vector<float> cq(q.size()), ck(k.size());
  for (std::int64_t l = 0; l < 4; ++l)
    for (std::int64_t e = 0; e < 16; ++e) cq[static_cast<std::size_t>(l * 16 + e)] = qkv[static_cast<std::size_t>(l * 48 + e)],
                                         ck[static_cast<std::size_t>(l * 16 + e)] = qkv[static_cast<std::size_t>(l * 48 + 16 + e)];
  ASSERT_TRUE(rope_apply_qk(RopeParams{}, V(cq.data()), V(ck.data()), Positions{}, V(want_q.data()), V(want_k.data())).ok());
  ASSERT_TRUE(rope_apply_qk(RopeParams{}, slice(0), slice(1), Positions{}, slice(0), slice(1)).ok());
  for (std::int64_t l = 0; l < 4; ++l)
    for (std::int64_t e = 0; e < 16; ++e) {
      EXPECT_EQ(qkv[static_cast<std::size_t>(l * 48 + e)], want_q[static_cast<std::size_t>(l * 16 + e)]);
      EXPECT_EQ(qkv[static_cast<std::size_t>(l * 48 + 16 + e)], want_k[static_cast<std::size_t>(l * 16 + e)]);
    }
  float none = 0;
  const View e = View::contiguous(&none, DType::kF32, {0, 4, 2, 8});
  EXPECT_TRUE(rope_apply_qk(RopeParams{}, e, e, Positions{}, e, e).ok());
}

// Exactness at large positions: x = (1, 0) pairs give y = (cos mθ_k, sin mθ_k); compare with a
// long-double angle and assert the bound stated in src/core/simd-inl.h, 3·10⁻⁷ + |mθ_k|·2⁻⁵¹.
TEST(FastElementwiseRope, LargePositionsWithinTheStatedBound) {
  const std::int64_t L = 64, D = 128;
  std::vector<std::int64_t> ids(static_cast<std::size_t>(L));
  for (std::int64_t l = 0; l < L; ++l) ids[static_cast<std::size_t>(l)] = 4000000 - 61 * l * l;
  ids[0] = 4000000;
  std::vector<float> x(static_cast<std::size_t>(L * D)), y(x.size());
  for (std::size_t i = 0; i < x.size(); i += 2) x[i] = 1.0f;
  ForEachTarget([&](const std::string& target) {
    for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
      RopeParams p;
      p.layout = layout;
      std::vector<float> xin(x.size(), 0.0f);
      for (std::int64_t l = 0; l < L; ++l)
        for (std::int64_t k = 0; k < D / 2; ++k)
          xin[static_cast<std::size_t>(l * D + (layout == RopeLayout::kHalf ? k : 2 * k))] = 1.0f;
      Positions pos;
      pos.ids = View::contiguous(ids.data(), DType::kI64, {L});
      ASSERT_TRUE(rope_forward(p, View::contiguous(xin.data(), DType::kF32, {1, L, 1, D}), pos,
                               View::contiguous(y.data(), DType::kF32, {1, L, 1, D}))
                      .ok());
      double worst = 0;
      for (std::int64_t l = 0; l < L; ++l)
        for (std::int64_t k = 0; k < D / 2; ++k) {
          const long double a = static_cast<long double>(ids[static_cast<std::size_t>(l)]) *
                                powl(10000.0L, -2.0L * k / D);
          const std::int64_t ia = layout == RopeLayout::kHalf ? k : 2 * k;
          const std::int64_t ib = layout == RopeLayout::kHalf ? k + D / 2 : 2 * k + 1;
          const double ec = std::fabs(y[static_cast<std::size_t>(l * D + ia)] - static_cast<double>(cosl(a)));
          const double es = std::fabs(y[static_cast<std::size_t>(l * D + ib)] - static_cast<double>(sinl(a)));
          const double bound = 3e-7 + static_cast<double>(a) * std::ldexp(1.0, -51);
          worst = std::max(worst, std::max(ec, es));
          ASSERT_LE(ec, bound) << target << " l=" << l << " k=" << k;
          ASSERT_LE(es, bound) << target << " l=" << l << " k=" << k;
        }
      EXPECT_LT(worst, 3.1e-7) << target;
    }
  });
}

TEST(FastElementwiseRope, OneAndTwoThreadsAgreeExactly) {
  const std::int64_t B = 2, L = 989, H = 2, D = 128;
  const std::vector<double> xs = randn(static_cast<std::size_t>(B * L * H * D), 5);
  for (DType dt : kDtypes) {
    Buf x(dt, {B, L, H, D}), y1(dt, {B, L, H, D}), y2(dt, {B, L, H, D});
    x.fill(xs);
    RopeParams p;
    p.layout = RopeLayout::kHalf;
    set_num_threads(1);
    ASSERT_TRUE(rope_forward(p, x.v, Positions{}, y1.v).ok());
    set_num_threads(2);
    EXPECT_EQ(num_threads(), 2);
    ASSERT_TRUE(rope_forward(p, x.v, Positions{}, y2.v).ok());
    set_num_threads(0);
    EXPECT_EQ(std::memcmp(y1.mem.data(), y2.mem.data(), y1.mem.size()), 0) << dtype_name(dt);
  }
}

// Outputs of at least fast::kStreamMinBytes take the non-temporal stores (vector-aligned rows, every
// dtype); misaligned outputs the plain stores. Reference computed once per case, compared on every
// target.
TEST(FastElementwiseRope, LargeStreamedOutputsMatchReference) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::int64_t L = 1024 / static_cast<std::int64_t>(dtype_size(dt)), H = 32, D = 128;  // q + k: 8 MiB
    const std::vector<std::int64_t> shape = {1, L, H, D};
    Buf q(dt, shape), k(dt, shape), qa(dt, shape, false, false, true),
        qm(dt, shape, false, true, true);
    Buf ko(dt, shape, false, false, true);
    q.fill(randn(static_cast<std::size_t>(L * H * D), 31));
    k.fill(randn(static_cast<std::size_t>(L * H * D), 32));
    for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
      RopeParams p;
      p.layout = layout;
      Positions pos;
      pos.offset = 3000;
      ASSERT_TRUE(reference::rope_forward(p, q.v, pos, qa.v).ok());
      ASSERT_TRUE(reference::rope_forward(p, k.v, pos, ko.v).ok());
      const std::vector<double> wq = qa.values(), wk = ko.values();
      const Tol t = tol_for(dt);
      ForEachTarget([&](const std::string& target) {
        for (bool misaligned : {false, true}) {
          Buf& qo = misaligned ? qm : qa;
          qo.reset();
          ko.reset();
          ASSERT_TRUE(rope_apply_qk(p, q.v, k.v, pos, qo.v, ko.v).ok());
          const std::string what = target + " " + rope_layout_name(layout) + " " + dtype_name(dt) +
                                   (misaligned ? " misaligned" : "");
          EXPECT_TRUE(qo.close_to(wq, t.atol, t.rtol)) << what;
          EXPECT_TRUE(ko.close_to(wk, t.atol, t.rtol)) << what;
          EXPECT_TRUE(qo.guards_ok()) << what;
          EXPECT_TRUE(ko.guards_ok()) << what;
        }
      });
    }
  }
}

// The frequency schemes, both angle modes and the attention factor (rope.h) through the fast path:
// the frequencies come from one place (RopeFrequencies), so this checks that the kernel reads them
// right (hf angles formed per token, a·cos, a·sin, the per-call cache) on every target and dtype.
std::vector<RopeParams> rope_scheme_variants(std::int64_t r) {
  auto list = [&](double a, double b) {
    std::vector<double> v(static_cast<std::size_t>(r / 2));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = a + (b - a) * static_cast<double>(i) / static_cast<double>(v.size());
    return v;
  };
  std::vector<RopeParams> out;
  RopeParams p;
  p.angles = RopeAngles::kHf;
  p.theta = 500000;
  out.push_back(p);
  p = RopeParams{};
  p.rope_type = RopeType::kLinear;
  p.factor = 4;
  out.push_back(p);
  p.rope_type = RopeType::kNtk;
  p.angles = RopeAngles::kHf;
  out.push_back(p);
  p = RopeParams{};
  p.rope_type = RopeType::kDynamic;
  p.factor = 2;
  p.original_max_position = 500;
  out.push_back(p);
  p = RopeParams{};
  p.rope_type = RopeType::kYarn;
  p.theta = 1e6;
  p.factor = 4;
  p.original_max_position = 1024;
  p.mscale = 0.707;
  p.mscale_all_dim = 1;
  out.push_back(p);
  p.angles = RopeAngles::kHf;
  p.attention_factor = 0.75;
  out.push_back(p);
  p = RopeParams{};
  p.rope_type = RopeType::kLlama3;
  p.theta = 500000;
  p.factor = 8;
  p.original_max_position = 2048;
  out.push_back(p);
  p = RopeParams{};
  p.rope_type = RopeType::kLongrope;
  p.factor = 32;
  p.original_max_position = 1500;
  p.short_factor = list(1.0, 3.0);
  p.long_factor = list(1.0, 60.0);
  out.push_back(p);
  p.angles = RopeAngles::kHf;
  out.push_back(p);
  p = RopeParams{};
  p.freq_factors = list(1.0, 0.25);
  p.attention_factor = 1.3;
  out.push_back(p);
  p = RopeParams{};
  p.inv_freq = list(2.0, 0.0);
  p.angles = RopeAngles::kHf;
  out.push_back(p);
  return out;
}

TEST(FastElementwiseRope, EverySchemeAngleModeAndAttentionFactorMatchReference) {
  struct Shape {
    std::int64_t B, L, Hq, Hk, D, r;
  };
  const Shape shapes[] = {{2, 19, 3, 1, 64, 0}, {1, 7, 2, 2, 130, 66}};
  int n = 0;
  ForEachTarget([&](const std::string& target) {
    for (const Shape& sh : shapes)
      for (DType dt : kDtypes)
        for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
          const std::int64_t r = sh.r ? sh.r : sh.D;
          int v = 0;
          for (RopeParams p : rope_scheme_variants(r)) {
            ++n;
            ++v;
            p.layout = layout;
            p.rotary_dim = sh.r;
            const bool backward = n % 2 == 0, in_place = n % 3 == 0;
            const std::vector<std::int64_t> qs = {sh.B, sh.L, sh.Hq, sh.D}, ks = {sh.B, sh.L, sh.Hk, sh.D};
            Buf q(dt, qs, n % 4 == 0, n % 5 == 0), k(dt, ks), qo(dt, qs), ko(dt, ks, true);
            Buf rq(dt, qs), rk(dt, ks), rqo(dt, qs), rko(dt, ks);
            const std::vector<double> xq = randn(static_cast<std::size_t>(q.v.numel()), 900 + n);
            const std::vector<double> xk = randn(static_cast<std::size_t>(k.v.numel()), 1900 + n);
            q.fill(xq);
            rq.fill(xq);
            k.fill(xk);
            rk.fill(xk);
            // Positions from 0 to ~10⁶ (hf's float products round there), some beyond the schemes' L.
            std::vector<std::int64_t> ids(static_cast<std::size_t>(sh.B * sh.L));
            const std::vector<double> pr = random_positions(sh.B * sh.L, 70 + n, n % 2 ? 400.0 : 300000.0);
            for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(pr[i]);
            Positions pos;
            pos.ids = View::contiguous(ids.data(), DType::kI64, {sh.B, sh.L});
            const View& qout = in_place ? q.v : qo.v;
            const View& kout = in_place ? k.v : ko.v;
            const Status s = rope_apply_qk(p, q.v, k.v, pos, qout, kout, backward);
            const std::string what = target + " " + dtype_name(dt) + " " + rope_layout_name(layout) + " variant " +
                                     std::to_string(v) + " (" + rope_type_name(p.rope_type) + ", " +
                                     rope_angles_name(p.angles) + ") D=" + std::to_string(sh.D);
            ASSERT_TRUE(s.ok()) << what << ": " << s.message();
            ASSERT_NO_FATAL_FAILURE(ReferenceQk(p, pos, backward, rq, rk, rqo, rko));
            const Tol t = tol_for(dt);
            const double a = p.attention_factor.value_or(1.5);  // ≥ every scheme's factor here
            EXPECT_TRUE(AllClose((in_place ? q : qo).values(), rqo.values(), a * t.atol, t.rtol)) << what;
            EXPECT_TRUE(AllClose((in_place ? k : ko).values(), rko.values(), a * t.atol, t.rtol)) << what;
            for (const Buf* b : {&q, &k, &qo, &ko}) EXPECT_TRUE(b->guards_ok()) << what;
          }
        }
  });
  EXPECT_GT(n, 0);
}

// The fast path keeps a call's frequencies for the next call: decode steps of dynamic NTK beyond its
// window (a new length every step), changed parameters and an explicit seq_len must all rebuild them.
TEST(FastElementwiseRope, KeptFrequenciesFollowTheCall) {
  const std::int64_t D = 32;
  RopeParams dyn;
  dyn.rope_type = RopeType::kDynamic;
  dyn.factor = 3;
  dyn.original_max_position = 100;
  dyn.layout = RopeLayout::kHalf;
  RopeParams other = dyn;
  other.factor = 5;
  RopeParams fixed_len = dyn;
  fixed_len.seq_len = 4000;
  const std::vector<double> xs = randn(static_cast<std::size_t>(D), 77);
  for (std::int64_t step = 0; step < 12; ++step) {
    const RopeParams& p = step % 3 == 0 ? dyn : (step % 3 == 1 ? other : fixed_len);
    Buf x(DType::kF32, {1, 1, 1, D}), y(DType::kF32, {1, 1, 1, D}), rx(DType::kF32, {1, 1, 1, D}),
        ry(DType::kF32, {1, 1, 1, D});
    x.fill(xs);
    rx.fill(xs);
    Positions pos;
    pos.offset = 90 + 7 * step;  // from inside the window to beyond it
    ASSERT_TRUE(rope_forward(p, x.v, pos, y.v).ok());
    ASSERT_TRUE(reference::rope_forward(p, rx.v, pos, ry.v).ok());
    EXPECT_TRUE(AllClose(y.values(), ry.values(), 6e-6, 1e-5)) << "step " << step;
  }
}

}  // namespace
}  // namespace posenc
