// The fast paths (public posenc:: entry points: Highway SIMD + OpenMP) against posenc::reference::,
// on every SIMD target compiled and supported here, for float32 / bfloat16 / float16 storage, odd
// sizes, strided and misaligned views, guard bands around outputs, in place, large positions, and one
// and two threads. The reference runs on the same 16-bit-rounded inputs; tolerances scale with dtype.
// Never times anything.
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "posenc/absolute.h"
#include "posenc/bias.h"
#include "posenc/reference.h"
#include "posenc/rope.h"
#include "posenc/threads.h"
#include "testing.h"

namespace posenc {
namespace {

using testing::AllClose;
using testing::randn;

constexpr DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr unsigned char kSentinel = 0xA5;
constexpr std::int64_t kGuard = 8;  // elements before and after every buffer

// A tensor in a buffer with guard bands (sentinel bytes) before, after and between strided rows.
struct Buf {
  std::vector<unsigned char> mem;
  View v;
  std::size_t es = 0, base = 0;
  std::int64_t span = 0;

  Buf(DType dt, const std::vector<std::int64_t>& shape, bool strided = false, bool misaligned = false) {
    es = dtype_size(dt);
    const int nd = static_cast<int>(shape.size());
    v.dtype = dt;
    v.ndim = nd;
    std::int64_t s = 1;
    for (int i = nd - 1; i >= 0; --i) {
      v.shape[i] = shape[static_cast<std::size_t>(i)];
      v.strides[i] = s;
      s *= v.shape[i];
      if (strided && i == nd - 1) s += 3;  // gap after every innermost row
      if (strided && i == nd - 2) s += 5;
    }
    span = 1;
    for (int i = 0; i < nd; ++i) {
      if (v.shape[i] == 0) span = 0;
      if (span) span += (v.shape[i] - 1) * v.strides[i];
    }
    base = static_cast<std::size_t>(kGuard + (misaligned ? 1 : 0));
    mem.assign((static_cast<std::size_t>(span) + 2 * kGuard + 1) * es, kSentinel);
    v.data = mem.data() + base * es;
  }
  Buf(const Buf&) = delete;

  void fill(const std::vector<double>& x) const {
    for (std::int64_t i = 0; i < v.numel(); ++i) v.set(i, x[static_cast<std::size_t>(i)]);
  }
  std::vector<double> values() const { return to_doubles(v); }

  // Every byte the view does not cover still holds the sentinel.
  ::testing::AssertionResult guards_ok() const {
    std::vector<char> mine(mem.size() / es, 0);
    for (std::int64_t i = 0; i < v.numel(); ++i) mine[base + static_cast<std::size_t>(v.offset_of(i))] = 1;
    for (std::size_t e = 0; e < mine.size(); ++e) {
      if (mine[e]) continue;
      for (std::size_t b = 0; b < es; ++b)
        if (mem[e * es + b] != kSentinel)
          return ::testing::AssertionFailure() << "byte " << b << " of element " << e << " (base " << base
                                               << ") was overwritten";
    }
    return ::testing::AssertionSuccess();
  }
};

struct Tol {
  double atol, rtol;
};
Tol tol_for(DType dt) {
  switch (dt) {
    case DType::kBF16: return {1.6e-2, 8e-3};  // one bfloat16 ulp (2⁻⁸) either side
    case DType::kF16: return {2e-3, 1e-3};     // one float16 ulp (2⁻¹¹)
    default: return {6e-6, 1e-5};              // float32: sin/cos error ≤ 3·10⁻⁷ times |x| ≲ 5
  }
}

std::string target_name(std::int64_t t) { return hwy::TargetName(t); }

// Runs body once per SIMD target compiled and supported here, then restores the default.
void ForEachTarget(const std::function<void(const std::string&)>& body) {
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    body(target_name(t));
  }
  hwy::SetSupportedTargetsForTest(0);
}

std::vector<double> random_positions(std::int64_t n, std::uint64_t seed, double scale) {
  std::vector<double> r = randn(static_cast<std::size_t>(n), seed);
  for (double& x : r) x = std::floor(std::fabs(x) * scale);
  return r;
}

// ---- RoPE ----------------------------------------------------------------------------------------

struct RopeCase {
  std::int64_t B, L, H, D, r;
};
const RopeCase kRopeCases[] = {{1, 1, 1, 2, 0},   {2, 3, 2, 6, 4},    {1, 19, 3, 64, 0},
                               {2, 3, 2, 130, 0}, {1, 19, 2, 128, 64}, {1, 989, 1, 64, 0},
                               {2, 19, 2, 130, 66}};

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
          ASSERT_TRUE(s.ok()) << what << ": " << s.message();
          ASSERT_TRUE(rs.ok()) << rs.message();
          const Tol t = tol_for(dt);
          const Buf& got = in_place ? x : y;
          EXPECT_TRUE(AllClose(got.values(), ry.values(), t.atol, t.rtol)) << what;
          EXPECT_TRUE(x.guards_ok()) << what;
          EXPECT_TRUE(y.guards_ok()) << what;
        }
  });
  EXPECT_GT(n, 0);
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
          if (backward) {
            ASSERT_TRUE(reference::rope_backward(p, rq.v, pos, rqo.v).ok());
            ASSERT_TRUE(reference::rope_backward(p, rk.v, pos, rko.v).ok());
          } else {
            ASSERT_TRUE(reference::rope_forward(p, rq.v, pos, rqo.v).ok());
            ASSERT_TRUE(reference::rope_forward(p, rk.v, pos, rko.v).ok());
          }
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

// ---- absolute encodings -----------------------------------------------------------------------

struct AbsCase {
  std::int64_t B, L, D;
};
const AbsCase kAbsCases[] = {{1, 1, 2}, {2, 3, 6}, {1, 19, 64}, {2, 3, 130}, {1, 989, 128}};

TEST(FastElementwiseAbsolute, SinusoidalMatchesReference) {
  int n = 0;
  ForEachTarget([&](const std::string& target) {
    for (DType dt : kDtypes)
      for (const AbsCase& c : kAbsCases) {
        ++n;
        const bool strided = n % 2 == 0, misaligned = n % 3 == 0, in_place = n % 4 == 1, with_ids = n % 3 == 1;
        SinusoidalParams p;
        p.base = n % 2 ? 10000.0 : 100.0;
        const std::vector<std::int64_t> shape = {c.B, c.L, c.D};
        const std::vector<double> xs = randn(static_cast<std::size_t>(c.B * c.L * c.D), 500 + n);
        Buf x(dt, shape, strided, misaligned), y(dt, shape, !strided, misaligned), rx(dt, shape), ry(dt, shape);
        x.fill(xs);
        rx.fill(xs);
        std::vector<std::int64_t> ids(static_cast<std::size_t>(c.L));
        const std::vector<double> pr = random_positions(c.L, 9 + n, 50000.0);
        for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(pr[i]);
        Positions pos;
        if (with_ids) pos.ids = View::contiguous(ids.data(), DType::kI64, {c.L});
        pos.offset = 77;
        const std::string what = target + " " + dtype_name(dt) + " case " + std::to_string(n);
        const Tol t = tol_for(dt);
        const View& out = in_place ? x.v : y.v;
        ASSERT_TRUE(sinusoidal_forward(p, x.v, pos, out).ok()) << what;
        ASSERT_TRUE(reference::sinusoidal_forward(p, rx.v, pos, ry.v).ok());
        EXPECT_TRUE(AllClose((in_place ? x : y).values(), ry.values(), t.atol, t.rtol)) << what;
        // backward: dx = dy, exactly
        Buf dx(dt, shape, strided, !misaligned);
        ASSERT_TRUE(sinusoidal_backward(p, x.v, pos, dx.v).ok()) << what;
        EXPECT_EQ(dx.values(), x.values()) << what;
        // the table: rows for the positions
        Buf tab(dt, {c.L, c.D}, strided, misaligned), rtab(dt, {c.L, c.D});
        ASSERT_TRUE(sinusoidal_table(p, pos, tab.v).ok()) << what;
        ASSERT_TRUE(reference::sinusoidal_table(p, pos, rtab.v).ok());
        EXPECT_TRUE(AllClose(tab.values(), rtab.values(), t.atol, t.rtol)) << what;
        for (const Buf* b : {&x, &y, &dx, &tab}) EXPECT_TRUE(b->guards_ok()) << what;
      }
  });
}

TEST(FastElementwiseAbsolute, SinusoidalLargePositionsWithinTheStatedBound) {
  const std::int64_t L = 16, D = 256;
  std::vector<std::int64_t> ids(static_cast<std::size_t>(L));
  for (std::int64_t l = 0; l < L; ++l) ids[static_cast<std::size_t>(l)] = 4000000 - 12345 * l;
  std::vector<float> out(static_cast<std::size_t>(L * D));
  Positions pos;
  pos.ids = View::contiguous(ids.data(), DType::kI64, {L});
  ForEachTarget([&](const std::string& target) {
    ASSERT_TRUE(sinusoidal_table(SinusoidalParams{}, pos, View::contiguous(out.data(), DType::kF32, {L, D})).ok());
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int64_t d = 0; d < D; ++d) {
        const long double a = static_cast<long double>(ids[static_cast<std::size_t>(l)]) *
                              powl(10000.0L, -2.0L * (d / 2) / D);
        const double want = static_cast<double>(d % 2 ? cosl(a) : sinl(a));
        ASSERT_LE(std::fabs(out[static_cast<std::size_t>(l * D + d)] - want),
                  3e-7 + static_cast<double>(a) * std::ldexp(1.0, -51))
            << target << " l=" << l << " d=" << d;
      }
  });
}

TEST(FastElementwiseAbsolute, LearnedMatchesReference) {
  int n = 0;
  ForEachTarget([&](const std::string& target) {
    for (DType dt : kDtypes)
      for (const AbsCase& c : kAbsCases) {
        ++n;
        const bool strided = n % 2 == 1, misaligned = n % 3 == 0, in_place = n % 4 == 2;
        const std::int64_t max_len = c.L + 5;
        const std::vector<std::int64_t> shape = {c.B, c.L, c.D};
        const std::vector<double> xs = randn(static_cast<std::size_t>(c.B * c.L * c.D), 600 + n);
        const std::vector<double> es = randn(static_cast<std::size_t>(max_len * c.D), 700 + n);
        Buf x(dt, shape, strided, misaligned), y(dt, shape, !strided, !misaligned), rx(dt, shape), ry(dt, shape);
        Buf e(dt, {max_len, c.D}, !strided, misaligned), re(dt, {max_len, c.D});
        x.fill(xs);
        rx.fill(xs);
        e.fill(es);
        re.fill(es);
        std::vector<std::int32_t> ids(static_cast<std::size_t>(c.B * c.L));
        for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7 + n) % (c.L + 4));
        Positions pos;
        pos.ids = View::contiguous(ids.data(), DType::kI32, {c.B, c.L});
        pos.offset = 1;
        const std::string what = target + " " + dtype_name(dt) + " case " + std::to_string(n);
        const Tol t = tol_for(dt);
        const View& out = in_place ? x.v : y.v;
        ASSERT_TRUE(learned_forward(LearnedParams{}, x.v, e.v, pos, out).ok()) << what;
        ASSERT_TRUE(reference::learned_forward(LearnedParams{}, rx.v, re.v, pos, ry.v).ok());
        EXPECT_TRUE(AllClose((in_place ? x : y).values(), ry.values(), t.atol, t.rtol)) << what;
        // backward
        Buf dx(dt, shape, strided, misaligned), de(dt, {max_len, c.D}, strided), rdx(dt, shape), rde(dt, {max_len, c.D});
        ASSERT_TRUE(learned_backward(LearnedParams{}, ry.v, e.v, pos, dx.v, de.v).ok()) << what;
        ASSERT_TRUE(reference::learned_backward(LearnedParams{}, ry.v, re.v, pos, rdx.v, rde.v).ok());
        EXPECT_EQ(dx.values(), rdx.values()) << what;
        EXPECT_EQ(de.values(), rde.values()) << what;
        for (const Buf* b : {&x, &y, &e, &dx, &de}) EXPECT_TRUE(b->guards_ok()) << what;
        // out of range: the same error, nothing written
        std::vector<std::int32_t> far(ids.size(), static_cast<std::int32_t>(max_len));
        Positions bad;
        bad.ids = View::contiguous(far.data(), DType::kI32, {c.B, c.L});
        EXPECT_EQ(learned_forward(LearnedParams{}, x.v, e.v, bad, y.v).message(),
                  reference::learned_forward(LearnedParams{}, x.v, e.v, bad, y.v).message());
      }
  });
}

// ---- logit biases (fast = reference bit for bit) ----------------------------------------------------

TEST(FastElementwiseBias, AlibiAndT5EqualTheReference) {
  struct G {
    std::int64_t H, M, N, qo, ko;
  };
  const G gs[] = {{1, 1, 1, 0, 0}, {4, 3, 19, -1, 0}, {6, 19, 3, 0, 7}, {8, 64, 130, 0, 0}, {2, 1, 989, 988, 0}};
  int n = 0;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64})
    for (const G& gg : gs) {
      ++n;
      BiasGeometry g{gg.H, gg.M, gg.N, gg.qo < 0 ? gg.N - gg.M : gg.qo, gg.ko};
      const std::string what = std::string(dtype_name(dt)) + " case " + std::to_string(n);
      for (AlibiVariant var : {AlibiVariant::kSymmetric, AlibiVariant::kNonsymmetric, AlibiVariant::kLearned}) {
        if (var == AlibiVariant::kNonsymmetric && g.heads % 2) continue;
        Buf out(dt, {g.heads, g.q_len, g.k_len}, n % 2 == 0, n % 3 == 0), ref(dt, {g.heads, g.q_len, g.k_len});
        Buf w(dt, {2, g.heads});
        w.fill(randn(static_cast<std::size_t>(2 * g.heads), 800 + n));
        const View wv = var == AlibiVariant::kLearned ? w.v : View{};
        ASSERT_TRUE(alibi_bias(AlibiParams{var}, g, View{}, wv, out.v).ok()) << what;
        ASSERT_TRUE(reference::alibi_bias(AlibiParams{var}, g, View{}, wv, ref.v).ok());
        EXPECT_EQ(out.values(), ref.values()) << what << " " << alibi_variant_name(var);
        EXPECT_TRUE(out.guards_ok()) << what;
      }
      for (bool bidir : {true, false}) {
        T5Params p;
        p.bidirectional = bidir;
        p.num_buckets = 16;
        p.max_distance = 40;
        Buf w(dt, {p.num_buckets, g.heads});
        w.fill(randn(static_cast<std::size_t>(p.num_buckets * g.heads), 900 + n));
        Buf out(dt, {g.heads, g.q_len, g.k_len}, n % 2 == 1, n % 3 == 1), ref(dt, {g.heads, g.q_len, g.k_len});
        ASSERT_TRUE(t5_bias(p, g, w.v, out.v).ok()) << what;
        ASSERT_TRUE(reference::t5_bias(p, g, w.v, ref.v).ok());
        EXPECT_EQ(out.values(), ref.values()) << what;
        EXPECT_TRUE(out.guards_ok()) << what;
      }
    }
}

}  // namespace
}  // namespace posenc
