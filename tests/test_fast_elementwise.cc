// The fast paths (public posenc:: entry points: Highway SIMD + OpenMP) against posenc::reference::,
// on every SIMD target compiled and supported here, for float32 / bfloat16 / float16 storage, odd
// sizes, strided and misaligned views, guard bands around outputs, in place, large positions, one
// and two threads, outputs large enough for the non-temporal stores, 16-bit rounding, and the
// backward reductions (learned's dtable, ALiBi's and T5's dweights, KERPLE's dr1 and dr2, FIRE's
// gradients from its segment moments), and the rotary encodings of rotary.h (rope2d axial and mixed
// with its dfreqs, mrope chunked and interleaved, xpos queries and keys). The reference runs on the same
// 16-bit-rounded inputs; tolerances scale with dtype. Never times anything.
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "enc/bias/kerple/kerple_math.h"
#include "posenc/absolute.h"
#include "posenc/bias.h"
#include "posenc/half.h"
#include "posenc/reference.h"
#include "posenc/rope.h"
#include "posenc/rotary.h"
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
  bool dense = false;  // contiguous, no gaps

  // align64: the view starts on a 64-byte boundary (then + 1 element if misaligned), so that the
  // kernels' aligned non-temporal stores are taken.
  Buf(DType dt, const std::vector<std::int64_t>& shape, bool strided = false,
      bool misaligned = false, bool align64 = false) {
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
    mem.assign((static_cast<std::size_t>(span) + 2 * kGuard + 1) * es + (align64 ? 64 : 0),
               kSentinel);
    base = static_cast<std::size_t>(kGuard);
    while (align64 && reinterpret_cast<std::uintptr_t>(mem.data() + base * es) % 64 != 0) ++base;
    base += misaligned ? 1 : 0;
    v.data = mem.data() + base * es;
    dense = !strided && v.is_contiguous();
  }
  Buf(const Buf&) = delete;

  // Back to the state after construction (every byte the sentinel), reusing the memory.
  void reset() { std::memset(mem.data(), kSentinel, mem.size()); }
  // A contiguous view's elements copied from another contiguous view of the same dtype and size.
  void copy_from(const Buf& o) {
    std::memcpy(v.data, o.v.data, static_cast<std::size_t>(v.numel()) * es);
  }

  void fill(const std::vector<double>& x) const {
    for (std::int64_t i = 0; i < v.numel(); ++i) v.set(i, x[static_cast<std::size_t>(i)]);
  }
  std::vector<double> values() const { return to_doubles(v); }

  // Element i of a dense buffer, without View::get (large tensors).
  double at(std::size_t i) const {
    const unsigned char* e = static_cast<const unsigned char*>(v.data) + i * es;
    if (v.dtype == DType::kF32) {
      float f;
      std::memcpy(&f, e, 4);
      return f;
    }
    std::uint16_t bits;
    std::memcpy(&bits, e, 2);
    return v.dtype == DType::kBF16 ? to_float(bf16{bits}) : to_float(f16{bits});
  }

  // AllClose(values(), want, atol, rtol) for a dense buffer, without building values() (whose fresh
  // large vector costs more than the kernels under test).
  ::testing::AssertionResult close_to(const std::vector<double>& want, double atol,
                                      double rtol) const {
    if (static_cast<std::size_t>(v.numel()) != want.size())
      return ::testing::AssertionFailure() << "size";
    int bad = 0;
    std::string msg;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double g = at(i), w = want[i];
      if (std::isinf(g) && std::isinf(w) && (g > 0) == (w > 0)) continue;
      if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
        if (bad++ < 5)
          msg += " [" + std::to_string(i) + "] got " + std::to_string(g) + " want " +
                 std::to_string(w) + ";";
      }
    }
    if (bad)
      return ::testing::AssertionFailure() << bad << " of " << want.size() << " differ:" << msg;
    return ::testing::AssertionSuccess();
  }

  // Every byte the view does not cover still holds the sentinel.
  ::testing::AssertionResult guards_ok() const {
    if (dense) {  // the bytes before and after the view
      const std::size_t a = base * es, b = a + static_cast<std::size_t>(v.numel()) * es;
      for (std::size_t i = 0; i < mem.size(); i = i + 1 == a ? b : i + 1)
        if (mem[i] != kSentinel)
          return ::testing::AssertionFailure()
                 << "byte " << i << " (view at " << a << ".." << b << ") was overwritten";
      return ::testing::AssertionSuccess();
    }
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

// One fast call (status s; output x when in place, else y) against its reference call (rs, ry):
// both succeed, the values agree within the dtype's tolerance, and x's and y's guard bands hold.
void ExpectCallMatches(const Status& s, const Status& rs, const std::string& what, DType dt, bool in_place,
                       const Buf& x, const Buf& y, const Buf& ry) {
  ASSERT_TRUE(s.ok()) << what << ": " << s.message();
  ASSERT_TRUE(rs.ok()) << rs.message();
  const Tol t = tol_for(dt);
  const Buf& got = in_place ? x : y;
  EXPECT_TRUE(AllClose(got.values(), ry.values(), t.atol, t.rtol)) << what;
  EXPECT_TRUE(x.guards_ok()) << what;
  EXPECT_TRUE(y.guards_ok()) << what;
}

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
            if (backward) {
              ASSERT_TRUE(reference::rope_backward(p, rq.v, pos, rqo.v).ok());
              ASSERT_TRUE(reference::rope_backward(p, rk.v, pos, rko.v).ok());
            } else {
              ASSERT_TRUE(reference::rope_forward(p, rq.v, pos, rqo.v).ok());
              ASSERT_TRUE(reference::rope_forward(p, rk.v, pos, rko.v).ok());
            }
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

// Runs of consecutive positions take the rotation path (sinusoidal_kernels.cc): a double anchor every
// 64 positions, carried 8 at a time in double, rotated in float by the table of k·w. Its bound,
// derived there, is 2⁻²² + |a|·2⁻⁵¹ (tighter than the float sincos's 3·10⁻⁷): checked against long
// double at positions near 4·10⁶, across anchor blocks, runs cut by a gap, a run of one, and B = 2
// rows that share the positions.
TEST(FastElementwiseAbsolute, SinusoidalRunsWithinTheirBound) {
  // B·L = 300 rows: each thread reads the table from its own copy (SinusImpl's kCopyTableRows);
  // 200: from the shared table.
  for (const std::int64_t L : {150, 100}) {
    const std::int64_t D = 130;
    std::vector<std::int64_t> ids(static_cast<std::size_t>(L));
    for (std::int64_t l = 0; l < L; ++l)
      ids[static_cast<std::size_t>(l)] = 3999800 + l + (l >= 100 ? 7 : 0);
    ids[70] = 12;  // a run of one amid a run
    Positions pos;
    pos.ids = View::contiguous(ids.data(), DType::kI64, {L});
    std::vector<float> x(static_cast<std::size_t>(2 * L * D), 0.0f), y(x.size());
    ForEachTarget([&](const std::string& target) {
      ASSERT_TRUE(sinusoidal_forward(SinusoidalParams{},
                                     View::contiguous(x.data(), DType::kF32, {2, L, D}), pos,
                                     View::contiguous(y.data(), DType::kF32, {2, L, D}))
                      .ok());
      double worst = 0;
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t l = 0; l < L; ++l)
          for (std::int64_t d = 0; d < D; ++d) {
            const long double a = static_cast<long double>(ids[static_cast<std::size_t>(l)]) *
                                  powl(10000.0L, -2.0L * (d / 2) / D);
            const double want = static_cast<double>(d % 2 ? cosl(a) : sinl(a));
            const double err = std::fabs(y[static_cast<std::size_t>((b * L + l) * D + d)] - want);
            const double bound = (l == 70 ? 3e-7 : std::ldexp(1.0, -22)) +
                                 static_cast<double>(a) * std::ldexp(1.0, -51);
            worst = std::max(worst, err);
            ASSERT_LE(err, bound) << target << " L=" << L << " b=" << b << " l=" << l << " d=" << d;
          }
      EXPECT_LT(worst, 3e-7) << target;
    });
  }
}

// bfloat16 runs take a float recurrence (sinusoidal_rows-inl.h, AddRecurBf16): re-anchored every 16
// positions, it stays within 2⁻¹⁸ + |a|·2⁻⁵¹ of the exact PE before y = PE + x is rounded, so y
// lies between the roundings of (want ∓ that bound), want = x + PE in long double. The bound's
// worth of slack is about 300 times finer than bfloat16's spacing at 1: a wrong step, start or
// state between passes shows. Positions near 4·10⁶, runs of 6, 29 and 28 (passes of 1 to 4
// rows), a run of one, and B = 2 rows with their own x sharing the positions.
TEST(FastElementwiseAbsolute, SinusoidalBfloat16RunsWithinTheirBound) {
  // B·L = 300 rows: each thread reads the recurrence's table rows from its own copy (SinusImpl's
  // kCopyTableRows); 200: from the shared table.
  for (const std::int64_t L : {150, 100}) {
    const std::int64_t B = 2, D = 130;
    std::vector<std::int64_t> ids(static_cast<std::size_t>(L));
    for (std::int64_t l = 0; l < L; ++l)
      ids[static_cast<std::size_t>(l)] = 3999800 + l + (l >= 100 ? 7 : 0);
    ids[70] = 12;
    Positions pos;
    pos.ids = View::contiguous(ids.data(), DType::kI64, {L});
    auto bf16_bits = [](float f) {  // round to nearest even (finite values)
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    };
    auto bf16_value = [](std::uint16_t h) {
      const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return static_cast<double>(f);
    };
    const std::vector<double> xs = randn(static_cast<std::size_t>(B * L * D), 77);
    for (bool zero_x : {true, false}) {
      std::vector<std::uint16_t> x(xs.size()), y(xs.size());
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = zero_x ? 0 : bf16_bits(static_cast<float>(xs[i]));
      ForEachTarget([&](const std::string& target) {
        ASSERT_TRUE(sinusoidal_forward(SinusoidalParams{},
                                       View::contiguous(x.data(), DType::kBF16, {B, L, D}), pos,
                                       View::contiguous(y.data(), DType::kBF16, {B, L, D}))
                        .ok());
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t l = 0; l < L; ++l)
            for (std::int64_t d = 0; d < D; ++d) {
              const std::size_t e = static_cast<std::size_t>((b * L + l) * D + d);
              const long double a = static_cast<long double>(ids[static_cast<std::size_t>(l)]) *
                                    powl(10000.0L, -2.0L * (d / 2) / D);
              const double want = bf16_value(x[e]) + static_cast<double>(d % 2 ? cosl(a) : sinl(a));
              const double bound = std::ldexp(1.0, -18) + static_cast<double>(a) * std::ldexp(1.0, -51);
              const double lo = bf16_value(bf16_bits(static_cast<float>(want - bound)));
              const double hi = bf16_value(bf16_bits(static_cast<float>(want + bound)));
              const double got = bf16_value(y[e]);
              ASSERT_TRUE(got >= lo && got <= hi)
                  << target << " L=" << L << " zero_x=" << zero_x << " b=" << b << " l=" << l
                  << " d=" << d << ": " << got << " outside [" << lo << ", " << hi << "], want " << want;
            }
      });
    }
  }
}

TEST(FastElementwiseAbsolute, SinusoidalOneAndTwoThreadsAgreeExactly) {
  const std::int64_t B = 2, L = 989, D = 128;
  const std::vector<double> xs = randn(static_cast<std::size_t>(B * L * D), 6);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(B * L));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>(i % 700 + (i % 97 == 0 ? 5 : 0));
  for (DType dt : kDtypes)
    for (bool batched : {false, true}) {
      Buf x(dt, {B, L, D}), y1(dt, {B, L, D}), y2(dt, {B, L, D});
      x.fill(xs);
      Positions pos;
      if (batched) pos.ids = View::contiguous(ids.data(), DType::kI32, {B, L});
      set_num_threads(1);
      ASSERT_TRUE(sinusoidal_forward(SinusoidalParams{}, x.v, pos, y1.v).ok());
      set_num_threads(2);
      ASSERT_TRUE(sinusoidal_forward(SinusoidalParams{}, x.v, pos, y2.v).ok());
      set_num_threads(0);
      EXPECT_EQ(std::memcmp(y1.mem.data(), y2.mem.data(), y1.mem.size()), 0)
          << dtype_name(dt) << " " << batched;
    }
}

// Large outputs: the non-temporal stores (aligned and, misaligned by one element, the plain ones),
// in place, and the table itself.
TEST(FastElementwiseAbsolute, LargeStreamedOutputsMatchReference) {
  for (DType dt : kDtypes) {
    const std::int64_t L = dt == DType::kF32 ? 512 : 1024, D = 4096;  // 8 MiB
    const std::vector<std::int64_t> shape = {1, L, D};
    Positions pos, rev;  // runs (the rotations) and none (the float sincos per token)
    pos.offset = 100000;
    std::vector<std::int64_t> ids(static_cast<std::size_t>(L));
    for (std::int64_t l = 0; l < L; ++l) ids[static_cast<std::size_t>(l)] = 5 * (L - l);
    rev.ids = View::contiguous(ids.data(), DType::kI64, {L});
    // Few large buffers (first touches are slow on some machines): outputs reused for every call.
    Buf x(dt, shape), e(dt, {L, D}), ya(dt, shape, false, false, true),
        ym(dt, shape, false, true, true);
    x.fill(randn(static_cast<std::size_t>(L * D), 41));
    e.fill(randn(static_cast<std::size_t>(L * D), 42));
    const View ta = View::contiguous(ya.v.data, dt, {L, D}),
               tm = View::contiguous(ym.v.data, dt, {L, D});
    ASSERT_TRUE(reference::sinusoidal_forward(SinusoidalParams{}, x.v, pos, ya.v).ok());
    const std::vector<double> ws = ya.values();
    ASSERT_TRUE(reference::sinusoidal_forward(SinusoidalParams{}, x.v, rev, ya.v).ok());
    const std::vector<double> wr = ya.values();
    ASSERT_TRUE(reference::sinusoidal_table(SinusoidalParams{}, pos, ta).ok());
    const std::vector<double> wt = ya.values();
    ASSERT_TRUE(reference::learned_forward(LearnedParams{}, x.v, e.v, Positions{}, ya.v).ok());
    const std::vector<double> wl = ya.values();
    const Tol t = tol_for(dt);
    ForEachTarget([&](const std::string& target) {
      const std::string what = target + " " + dtype_name(dt);
      for (bool misaligned : {false, true}) {
        Buf& y = misaligned ? ym : ya;
        y.reset();
        ASSERT_TRUE(sinusoidal_forward(SinusoidalParams{}, x.v, pos, y.v).ok());
        EXPECT_TRUE(y.close_to(ws, t.atol, t.rtol)) << what << " sinusoidal " << misaligned;
        EXPECT_TRUE(y.guards_ok()) << what;
        y.reset();
        ASSERT_TRUE(sinusoidal_forward(SinusoidalParams{}, x.v, rev, y.v).ok());
        EXPECT_TRUE(y.close_to(wr, t.atol, t.rtol))
            << what << " sinusoidal, no runs " << misaligned;
        EXPECT_TRUE(y.guards_ok()) << what;
        y.reset();
        ASSERT_TRUE(sinusoidal_table(SinusoidalParams{}, pos, misaligned ? tm : ta).ok());
        EXPECT_TRUE(y.close_to(wt, t.atol, t.rtol)) << what << " table " << misaligned;
        EXPECT_TRUE(y.guards_ok()) << what;
        y.reset();
        ASSERT_TRUE(learned_forward(LearnedParams{}, x.v, e.v, Positions{}, y.v).ok());
        EXPECT_TRUE(y.close_to(wl, t.atol, t.rtol)) << what << " learned " << misaligned;
        EXPECT_TRUE(y.guards_ok()) << what;
      }
      ya.copy_from(x);
      ASSERT_TRUE(sinusoidal_forward(SinusoidalParams{}, ya.v, pos, ya.v).ok());
      EXPECT_TRUE(ya.close_to(ws, t.atol, t.rtol)) << what << " in place";
    });
  }
}

// The 16-bit stores round to nearest even on every target (Highway 1.0.3 emulates float16 by
// truncation on SSSE3/SSE4/scalar; simd-inl.h does not use it): x + e built to land on ties, on
// subnormals, past the largest finite value and on inf/NaN; exact equality with the reference,
// which rounds once from the exact float sum as half.h does.
TEST(FastElementwiseAbsolute, SixteenBitStoresRoundToNearestEven) {
  struct Pair {
    double x, e;
  };
  const std::vector<Pair> f16 = {{1.0 + 0x1p-10, 0x1p-11},
                                 {1.0, 0x1p-11},
                                 {-1.0 - 0x1p-10, -0x1p-11},
                                 {0x1p-14, 0x1p-25},
                                 {0x1p-24, 0x1p-25},
                                 {0x1.8p-24, 0x1p-25},
                                 {65504.0, 16.0},
                                 {65504.0, 8.0},
                                 {-65504.0, -32.0},
                                 {0x1p-14, -0x1p-24},
                                 {INFINITY, 1.0},
                                 {NAN, 0.0},
                                 {3.0, 0x1p-9},
                                 {2048.0, 1.0},
                                 {2049.0 - 1.0, 1.0}};
  const std::vector<Pair> b16 = {
      {1.0 + 0x1p-7, 0x1p-8}, {1.0, 0x1p-8},        {-1.0 - 0x1p-7, -0x1p-8},
      {0x1p-126, 0x1p-134},   {0x1p-133, 0x1p-134}, {0x1.fep127, 0x1p119},
      {INFINITY, 1.0},        {NAN, 0.0},           {3.0, 0x1p-6}};
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const std::vector<Pair>& cases = dt == DType::kF16 ? f16 : b16;
    const std::int64_t n = static_cast<std::int64_t>(cases.size()),
                       D = 64;  // every case in every lane
    std::vector<double> xs, es;
    for (std::int64_t r = 0; r < D; ++r)
      for (std::int64_t c = 0; c < n; ++c) {
        xs.push_back(cases[static_cast<std::size_t>((c + r) % n)].x);
        es.push_back(cases[static_cast<std::size_t>((c + r) % n)].e);
      }
    Buf x(dt, {1, n, D}), e(dt, {n, D}), ry(dt, {1, n, D});
    x.fill(xs);
    e.fill(es);
    ASSERT_TRUE(reference::learned_forward(LearnedParams{}, x.v, e.v, Positions{}, ry.v).ok());
    ForEachTarget([&](const std::string& target) {
      Buf y(dt, {1, n, D});
      ASSERT_TRUE(learned_forward(LearnedParams{}, x.v, e.v, Positions{}, y.v).ok());
      const std::vector<double> got = y.values(), want = ry.values();
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(want[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << target << " " << dtype_name(dt) << " " << i;
          continue;
        }
        ASSERT_EQ(got[i], want[i])
            << target << " " << dtype_name(dt) << " " << i << ": " << xs[i] << " + " << es[i];
      }
    });
  }
}

TEST(FastElementwiseAbsolute, LearnedBackwardEachOutputAlone) {
  const std::int64_t B = 2, L = 19, D = 130, max_len = 12;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(B * L));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>(i * i % 11);  // repeats, row 11 unused
  Positions pos;
  pos.ids = View::contiguous(ids.data(), DType::kI32, {B, L});
  const std::vector<double> gs = randn(static_cast<std::size_t>(B * L * D), 77);
  ForEachTarget([&](const std::string& target) {
    for (DType dt : kDtypes) {
      Buf dy(dt, {B, L, D}, true, true), table(dt, {max_len, D}), de(dt, {max_len, D}, false, true),
          rde(dt, {max_len, D});
      Buf dx(dt, {B, L, D}, false, true);
      dy.fill(gs);
      ASSERT_TRUE(learned_backward(LearnedParams{}, dy.v, table.v, pos, View{}, de.v).ok());
      ASSERT_TRUE(
          reference::learned_backward(LearnedParams{}, dy.v, table.v, pos, View{}, rde.v).ok());
      EXPECT_EQ(de.values(), rde.values()) << target << " " << dtype_name(dt);
      ASSERT_TRUE(learned_backward(LearnedParams{}, dy.v, table.v, pos, dx.v, View{}).ok());
      EXPECT_EQ(dx.values(), dy.values()) << target << " " << dtype_name(dt);
      for (const Buf* b : {&de, &dx})
        EXPECT_TRUE(b->guards_ok()) << target << " " << dtype_name(dt);
      // errors as the reference's
      Buf bad(dt, {max_len + 1, D});
      EXPECT_EQ(learned_backward(LearnedParams{}, dy.v, table.v, pos, View{}, bad.v).message(),
                reference::learned_backward(LearnedParams{}, dy.v, table.v, pos, View{}, bad.v)
                    .message());
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

// The backward reductions: dbias summed per distance (vectorised, double) then per parameter,
// against the reference's double sums over (i, j) in another order. Both sums of the same n = M·N
// terms differ by at most 2·n·2⁻⁵³·Σ|term| (each within n·2⁻⁵³·Σ|term| of the exact sum), then one
// rounding to the dtype each: |fast − ref| ≤ 2·n·2⁻⁵³·Σ|term|·(1 + ulp) + one ulp of the dtype at
// the value.
TEST(FastElementwiseBias, BackwardsMatchTheReference) {
  struct G {
    std::int64_t H, M, N, qo, ko;
  };
  const G gs[] = {{1, 1, 1, 0, 0},
                  {4, 3, 19, -1, 0},
                  {6, 19, 3, 0, 7},
                  {2, 64, 130, 0, 0},
                  {2, 1, 989, 988, 0}};
  auto ulp = [](DType dt) {
    return dt == DType::kF32 ? 0x1p-23 : dt == DType::kBF16 ? 0x1p-7 : 0x1p-10;
  };
  int n = 0;
  ForEachTarget([&](const std::string& target) {
    for (DType dt : kDtypes)
      for (const G& gg : gs) {
        ++n;
        const BiasGeometry g{gg.H, gg.M, gg.N, gg.qo < 0 ? gg.N - gg.M : gg.qo, gg.ko};
        const std::string what = target + " " + dtype_name(dt) + " case " + std::to_string(n);
        Buf db(dt, {g.heads, g.q_len, g.k_len}, n % 2 == 0, n % 3 == 0);
        const std::vector<double> dbs =
            randn(static_cast<std::size_t>(g.heads * g.q_len * g.k_len), 1000 + n);
        db.fill(dbs);
        double abs_sum = 0, abs_dist = 0;  // Σ|dbias|, Σ|dbias|·|r|
        for (std::int64_t h = 0; h < g.heads; ++h)
          for (std::int64_t i = 0; i < g.q_len; ++i)
            for (std::int64_t j = 0; j < g.k_len; ++j) {
              const double v = std::fabs(db.v.get((h * g.q_len + i) * g.k_len + j));
              abs_sum += v;
              abs_dist += v * static_cast<double>(std::llabs((g.k_offset + j) - (g.query_offset() + i)));
            }
        const double terms = static_cast<double>(g.q_len * g.k_len), slack = 3 * terms * 0x1p-53;
        // ALiBi, learned variant (the weights' σ' ≤ 1/4 scales the sums)
        Buf w(dt, {2, g.heads}), dw(dt, {2, g.heads}, false, true), rdw(dt, {2, g.heads});
        w.fill(randn(static_cast<std::size_t>(2 * g.heads), 1100 + n));
        const AlibiParams ap{AlibiVariant::kLearned};
        ASSERT_TRUE(alibi_bias_backward(ap, g, w.v, db.v, dw.v).ok()) << what;
        ASSERT_TRUE(reference::alibi_bias_backward(ap, g, w.v, db.v, rdw.v).ok());
        EXPECT_TRUE(AllClose(dw.values(), rdw.values(), slack * abs_dist, ulp(dt)))
            << what << " alibi";
        EXPECT_TRUE(dw.guards_ok()) << what;
        // T5
        for (bool bidir : {true, false}) {
          T5Params p;
          p.bidirectional = bidir;
          p.num_buckets = 16;
          p.max_distance = 40;
          Buf tw(dt, {p.num_buckets, g.heads}, false, true), rtw(dt, {p.num_buckets, g.heads});
          ASSERT_TRUE(t5_bias_backward(p, g, db.v, tw.v).ok()) << what;
          ASSERT_TRUE(reference::t5_bias_backward(p, g, db.v, rtw.v).ok());
          EXPECT_TRUE(AllClose(tw.values(), rtw.values(), slack * abs_sum, ulp(dt)))
              << what << " t5 " << bidir;
          EXPECT_TRUE(tw.guards_ok()) << what;
        }
      }
  });
  // Errors are the reference's.
  std::vector<float> db(2 * 3 * 4), w(4), bad(6);
  const BiasGeometry g{2, 3, 4, 0, 0};
  const View dbv = View::contiguous(db.data(), DType::kF32, {2, 3, 4}),
             wv = View::contiguous(w.data(), DType::kF32, {2, 2});
  const View badv = View::contiguous(bad.data(), DType::kF32, {3, 2});
  EXPECT_EQ(alibi_bias_backward(AlibiParams{AlibiVariant::kLearned}, g, wv, dbv, badv).message(),
            reference::alibi_bias_backward(AlibiParams{AlibiVariant::kLearned}, g, wv, dbv, badv)
                .message());
  EXPECT_EQ(alibi_bias_backward(AlibiParams{}, g, wv, dbv, wv).message(),
            reference::alibi_bias_backward(AlibiParams{}, g, wv, dbv, wv).message());
  EXPECT_EQ(t5_bias_backward(T5Params{}, g, dbv, badv).message(),
            reference::t5_bias_backward(T5Params{}, g, dbv, badv).message());
}

// ---- KERPLE, Sandwich, FIRE ----------------------------------------------------------------------

// Positive per-head values in (lo, lo + span).
std::vector<double> positive(std::size_t n, std::uint64_t seed, double lo, double span) {
  std::vector<double> r = randn(n, seed);
  for (double& x : r) x = lo + span * (0.5 + 0.5 * std::tanh(x));
  return r;
}

// KERPLE and Sandwich tabulate the reference's own double values per distance and copy rows: equal
// to it bit for bit in every dtype, strided or misaligned. FIRE evaluates its MLP as pieces (another
// summation order of the same double function): equal within one rounding of the dtype.
TEST(FastElementwiseBias, KerpleSandwichFireMatchTheReference) {
  struct G {
    std::int64_t H, M, N, qo, ko;
  };
  const G gs[] = {{1, 1, 1, 0, 0}, {4, 3, 19, -1, 0}, {6, 19, 3, 0, 7}, {8, 64, 130, 0, 0}, {2, 1, 989, 988, 0},
                  {3, 5, 40, 500, 480}};
  int n = 0;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64})
    for (const G& gg : gs) {
      ++n;
      const BiasGeometry g{gg.H, gg.M, gg.N, gg.qo < 0 ? gg.N - gg.M : gg.qo, gg.ko};
      const std::string what = std::string(dtype_name(dt)) + " case " + std::to_string(n);
      const std::vector<std::int64_t> shape = {g.heads, g.q_len, g.k_len};
      for (KerpleKernel k : {KerpleKernel::kLog, KerpleKernel::kPower}) {
        Buf r1(dt, {g.heads}), r2(dt, {g.heads});
        r1.fill(positive(static_cast<std::size_t>(g.heads), 1200 + n, 0.05, 2.0));
        r2.fill(positive(static_cast<std::size_t>(g.heads), 1300 + n, 0.05, 1.9));
        Buf out(dt, shape, n % 2 == 0, n % 3 == 0), ref(dt, shape);
        ASSERT_TRUE(kerple_bias({k}, g, r1.v, r2.v, out.v).ok()) << what;
        ASSERT_TRUE(reference::kerple_bias({k}, g, r1.v, r2.v, ref.v).ok());
        EXPECT_EQ(out.values(), ref.values()) << what << " kerple " << kerple_kernel_name(k);
        EXPECT_TRUE(out.guards_ok()) << what;
      }
      {
        const SandwichParams p{n % 2 ? 128 : 10, n % 2 ? 10000.0 : 50.0};
        Buf out(dt, shape, n % 2 == 1, n % 3 == 1), ref(dt, shape);
        ASSERT_TRUE(sandwich_bias(p, g, out.v).ok()) << what;
        ASSERT_TRUE(reference::sandwich_bias(p, g, ref.v).ok());
        EXPECT_EQ(out.values(), ref.values()) << what << " sandwich";
        EXPECT_TRUE(out.guards_ok()) << what;
      }
      {
        const std::int64_t W = 11;
        Buf w1(dt, {W}), b1(dt, {W}), w2(dt, {g.heads, W}), b2(dt, {g.heads}), c(DType::kF64, {1}), L(DType::kF32, {1});
        w1.fill(randn(static_cast<std::size_t>(W), 1400 + n, 1.5));
        b1.fill(randn(static_cast<std::size_t>(W), 1500 + n, 0.7));
        w2.fill(randn(static_cast<std::size_t>(g.heads * W), 1600 + n, 0.8));
        b2.fill(randn(static_cast<std::size_t>(g.heads), 1700 + n, 0.5));
        c.fill({0.2});
        L.fill({30.5});
        const FireTensors t{w1.v, b1.v, w2.v, b2.v, c.v, L.v};
        Buf out(dt, shape, n % 2 == 0, n % 3 == 2), ref(dt, shape);
        ASSERT_TRUE(fire_bias({}, g, t, out.v).ok()) << what;
        ASSERT_TRUE(reference::fire_bias({}, g, t, ref.v).ok());
        const double ulp = dt == DType::kF64 ? 1e-13 : dt == DType::kF32 ? 0x1p-23 : dt == DType::kBF16 ? 0x1p-7 : 0x1p-10;
        EXPECT_TRUE(AllClose(out.values(), ref.values(), 1e-13, ulp)) << what << " fire";
        EXPECT_TRUE(out.guards_ok()) << what;
      }
    }
}

// KERPLE's backward: dbias summed per distance (bias::diagonal_sums, Highway: every target) then
// weighted by the derivatives per distance, against the reference's double sums in another order
// (the bound of BackwardsMatchTheReference with Σ|dbias·∂b/∂r|). FIRE's: per-head segment moments,
// then the MLP's gradients, against the reference's per-pair chain rule in double.
TEST(FastElementwiseBias, KerpleAndFireBackwardsMatchTheReference) {
  struct G {
    std::int64_t H, M, N, qo, ko;
  };
  const G gs[] = {{1, 1, 1, 0, 0}, {4, 3, 19, -1, 0}, {6, 19, 3, 0, 7}, {2, 64, 130, 0, 0}, {2, 1, 989, 988, 0}};
  auto ulp = [](DType dt) {
    return dt == DType::kF32 ? 0x1p-23 : dt == DType::kBF16 ? 0x1p-7 : 0x1p-10;
  };
  int n = 0;
  ForEachTarget([&](const std::string& target) {
    for (DType dt : kDtypes)
      for (const G& gg : gs) {
        ++n;
        const BiasGeometry g{gg.H, gg.M, gg.N, gg.qo < 0 ? gg.N - gg.M : gg.qo, gg.ko};
        const std::string what = target + " " + dtype_name(dt) + " case " + std::to_string(n);
        const std::vector<std::int64_t> shape = {g.heads, g.q_len, g.k_len};
        Buf db(dt, shape, n % 2 == 0, n % 3 == 0);
        db.fill(randn(static_cast<std::size_t>(g.heads * g.q_len * g.k_len), 2000 + n));
        for (KerpleKernel k : {KerpleKernel::kLog, KerpleKernel::kPower}) {
          Buf r1(dt, {g.heads}), r2(dt, {g.heads});
          r1.fill(positive(static_cast<std::size_t>(g.heads), 2100 + n, 0.05, 2.0));
          r2.fill(positive(static_cast<std::size_t>(g.heads), 2200 + n, 0.05, 1.9));
          double bound = 0;  // Σ|dbias|·max(|∂b/∂r1|, |∂b/∂r2|)
          for (std::int64_t h = 0; h < g.heads; ++h)
            for (std::int64_t i = 0; i < g.q_len; ++i)
              for (std::int64_t j = 0; j < g.k_len; ++j) {
                const kerple::Term t = kerple::term(k == KerpleKernel::kPower, r1.v.get(h), r2.v.get(h),
                                                    static_cast<double>(std::llabs(g.k_offset + j - g.query_offset() - i)));
                bound += std::fabs(db.v.get((h * g.q_len + i) * g.k_len + j)) * std::max(std::fabs(t.d_r1), std::fabs(t.d_r2));
              }
          const double slack = 3 * static_cast<double>(g.q_len * g.k_len) * 0x1p-53 * bound;
          Buf d1(dt, {g.heads}, false, true), d2(dt, {g.heads}), w1(dt, {g.heads}), w2(dt, {g.heads});
          ASSERT_TRUE(kerple_bias_backward({k}, g, r1.v, r2.v, db.v, d1.v, d2.v).ok()) << what;
          ASSERT_TRUE(reference::kerple_bias_backward({k}, g, r1.v, r2.v, db.v, w1.v, w2.v).ok());
          EXPECT_TRUE(AllClose(d1.values(), w1.values(), slack, ulp(dt))) << what << " dr1";
          EXPECT_TRUE(AllClose(d2.values(), w2.values(), slack, ulp(dt))) << what << " dr2";
          EXPECT_TRUE(d1.guards_ok() && d2.guards_ok()) << what;
        }
        if (n % 3 != 0) continue;  // FIRE's backward has no SIMD: a third of the cases suffice
        const std::int64_t W = 7;
        Buf w1(dt, {W}), b1(dt, {W}), w2(dt, {g.heads, W}), b2(dt, {g.heads}), c(dt, {1}), L(dt, {1});
        w1.fill(randn(static_cast<std::size_t>(W), 2300 + n, 1.5));
        b1.fill(randn(static_cast<std::size_t>(W), 2400 + n, 0.7));
        w2.fill(randn(static_cast<std::size_t>(g.heads * W), 2500 + n, 0.8));
        b2.fill(randn(static_cast<std::size_t>(g.heads), 2600 + n, 0.5));
        c.fill({0.25});
        L.fill({20.5});
        const FireTensors t{w1.v, b1.v, w2.v, b2.v, c.v, L.v};
        std::vector<Buf*> got, want;
        std::vector<std::unique_ptr<Buf>> keep;
        for (int side = 0; side < 2; ++side)
          for (const View* x : {&w1.v, &b1.v, &w2.v, &b2.v, &c.v, &L.v}) {
            keep.push_back(std::make_unique<Buf>(DType::kF64, x->shape_vec()));
            (side ? want : got).push_back(keep.back().get());
          }
        auto grads = [](const std::vector<Buf*>& b) {
          return FireTensors{b[0]->v, b[1]->v, b[2]->v, b[3]->v, b[4]->v, b[5]->v};
        };
        ASSERT_TRUE(fire_bias_backward({}, g, t, db.v, grads(got)).ok()) << what;
        ASSERT_TRUE(reference::fire_bias_backward({}, g, t, db.v, grads(want)).ok());
        double scale = 1e-30;
        for (const Buf* b : want)
          for (double x : b->values()) scale = std::max(scale, std::fabs(x));
        for (std::size_t i = 0; i < got.size(); ++i)
          EXPECT_TRUE(AllClose(got[i]->values(), want[i]->values(), 1e-11 * scale, 1e-10)) << what << " fire grad " << i;
      }
  });
  // Errors are the reference's.
  std::vector<float> r(2, 0.5f), bad(3, 0.5f), db(2 * 3 * 4);
  const BiasGeometry g{2, 3, 4, 0, 0};
  const View rv = View::contiguous(r.data(), DType::kF32, {2}), badv = View::contiguous(bad.data(), DType::kF32, {3}),
             dbv = View::contiguous(db.data(), DType::kF32, {2, 3, 4});
  EXPECT_EQ(kerple_bias_backward({}, g, rv, rv, dbv, badv, View{}).message(),
            reference::kerple_bias_backward({}, g, rv, rv, dbv, badv, View{}).message());
  EXPECT_EQ(kerple_bias({}, g, badv, rv, dbv).message(), reference::kerple_bias({}, g, badv, rv, dbv).message());
  EXPECT_EQ(sandwich_bias({3, 1.0}, g, dbv).message(), reference::sandwich_bias({3, 1.0}, g, dbv).message());
}


// ---- the rotary encodings of rotary.h: RoPE's kernel with a plan ----------------------------------
// rope2d (axial, mixed), mrope (chunked, interleaved) and xpos (query, key) against the reference on
// every target and dtype, odd sizes, strided / misaligned / in-place views with guard bands, shared
// and batched positions of both integer types, forward and backward; mixed's dfreqs (float math,
// summed per thread in double) against the reference's double sums, on one and two threads.
struct RotaryCase {
  std::int64_t B, L, H, D, r;
};
const RotaryCase kRotaryCases[] = {{1, 1, 1, 4, 0}, {2, 3, 2, 12, 8}, {1, 19, 3, 64, 0}, {2, 5, 2, 130, 128},
                                   {1, 21, 2, 68, 64}};

enum class RotaryKind { kAxial, kMixed, kMrope, kMropeInterleaved, kXposQuery, kXposKey };
const char* rotary_kind_name(RotaryKind k) {
  switch (k) {
    case RotaryKind::kAxial: return "rope2d_axial";
    case RotaryKind::kMixed: return "rope2d_mixed";
    case RotaryKind::kMrope: return "mrope_chunked";
    case RotaryKind::kMropeInterleaved: return "mrope_interleaved";
    case RotaryKind::kXposQuery: return "xpos_query";
    default: return "xpos_key";
  }
}

// One call of either side (public or reference) of the encoding `kind`.
// r: rotary_dim (0 = D); r_full: its value (mrope's sections sum to r_full/2).
Status rotary_call(bool fast, RotaryKind kind, RopeLayout layout, std::int64_t r, std::int64_t r_full, bool backward,
                   const View& x, const Positions& pos, const View& freqs, const View& y) {
  if (kind == RotaryKind::kAxial || kind == RotaryKind::kMixed) {
    Rope2dParams p;
    p.variant = kind == RotaryKind::kMixed ? Rope2dVariant::kMixed : Rope2dVariant::kAxial;
    p.rope.layout = layout;
    p.rope.rotary_dim = r;
    if (backward)
      return fast ? rope2d_backward(p, x, pos, freqs, y) : reference::rope2d_backward(p, x, pos, freqs, y);
    return fast ? rope2d_forward(p, x, pos, freqs, y) : reference::rope2d_forward(p, x, pos, freqs, y);
  }
  if (kind == RotaryKind::kMrope || kind == RotaryKind::kMropeInterleaved) {
    MropeParams p;
    p.variant = kind == RotaryKind::kMrope ? MropeVariant::kChunked : MropeVariant::kInterleaved;
    p.rope.layout = layout;
    p.rope.rotary_dim = r;
    const std::int64_t half = r_full / 2, s = half / 3;
    p.mrope_section = {half - 2 * s, s, s};
    p.rope.theta = 1e6;
    if (half % 2 == 0) {  // a scheme with an attention factor on some shapes
      p.rope.rope_type = RopeType::kYarn;
      p.rope.factor = 4;
      p.rope.original_max_position = 256;
    }
    if (backward) return fast ? mrope_backward(p, x, pos, y) : reference::mrope_backward(p, x, pos, y);
    return fast ? mrope_forward(p, x, pos, y) : reference::mrope_forward(p, x, pos, y);
  }
  XposParams p;
  p.rope.layout = layout;
  p.rope.rotary_dim = r;
  const XposRole role = kind == RotaryKind::kXposQuery ? XposRole::kQuery : XposRole::kKey;
  if (backward) return fast ? xpos_backward(p, role, x, pos, y) : reference::xpos_backward(p, role, x, pos, y);
  return fast ? xpos_forward(p, role, x, pos, y) : reference::xpos_forward(p, role, x, pos, y);
}

int rotary_axes(RotaryKind k) {
  return k == RotaryKind::kAxial || k == RotaryKind::kMixed ? 2 : k == RotaryKind::kMrope || k == RotaryKind::kMropeInterleaved ? 3 : 1;
}

TEST(FastElementwiseRotary, MatchesReferenceEveryTargetDtypeOption) {
  int n = 0;
  ForEachTarget([&](const std::string& target) {
    for (RotaryKind kind : {RotaryKind::kAxial, RotaryKind::kMixed, RotaryKind::kMrope, RotaryKind::kMropeInterleaved,
                            RotaryKind::kXposQuery, RotaryKind::kXposKey})
      for (DType dt : kDtypes)
        for (const RotaryCase& c : kRotaryCases) {
          ++n;
          const RopeLayout layout = n % 2 ? RopeLayout::kInterleaved : RopeLayout::kHalf;
          const bool backward = n % 3 == 1, strided = n % 4 == 0, misaligned = n % 5 == 1, in_place = n % 7 == 2,
                     batched = n % 2 == 0, int32 = n % 3 == 0;
          const std::int64_t r = c.r == 0 ? c.D : c.r, A = rotary_axes(kind);
          const std::vector<std::int64_t> shape = {c.B, c.L, c.H, c.D};
          const std::vector<double> xs = randn(static_cast<std::size_t>(c.B * c.L * c.H * c.D), 3100 + n);
          Buf x(dt, shape, strided, misaligned), y(dt, shape, !strided, !misaligned), rx(dt, shape), ry(dt, shape);
          x.fill(xs);
          rx.fill(xs);
          // positions: [A, L] or [B, A, L] (xpos: [L] or [B, L]), values up to ~3000
          const std::int64_t np = (batched ? c.B : 1) * A * c.L;
          const std::vector<double> pr = random_positions(np, 3200 + n, 1500.0);
          std::vector<std::int32_t> i32(static_cast<std::size_t>(np));
          std::vector<std::int64_t> i64(static_cast<std::size_t>(np));
          for (std::size_t i = 0; i < i32.size(); ++i) i32[i] = static_cast<std::int32_t>(pr[i]), i64[i] = static_cast<std::int64_t>(pr[i]);
          std::vector<std::int64_t> pshape;
          if (batched) pshape.push_back(c.B);
          if (A > 1) pshape.push_back(A);
          pshape.push_back(c.L);
          Positions pos;
          pos.ids = View::contiguous(int32 ? static_cast<void*>(i32.data()) : static_cast<void*>(i64.data()),
                                     int32 ? DType::kI32 : DType::kI64, pshape);
          if (n % 11 == 5) pos = Positions{View{}, 777};  // no ids: the offset in every component
          Buf f(dt, {2, c.H, r / 2});
          f.fill(randn(static_cast<std::size_t>(2 * c.H * r / 2), 3300 + n, 0.3));
          const View fv = kind == RotaryKind::kMixed ? f.v : View{};
          const View& out = in_place ? x.v : y.v;
          const Status s = rotary_call(true, kind, layout, c.r, r, backward, x.v, pos, fv, out);
          const Status rs = rotary_call(false, kind, layout, c.r, r, backward, rx.v, pos, fv, ry.v);
          const std::string what = target + " " + rotary_kind_name(kind) + " " + rope_layout_name(layout) + " " +
                                   dtype_name(dt) + " case " + std::to_string(n) + " D=" + std::to_string(c.D) +
                                   (backward ? " backward" : " forward");
          ExpectCallMatches(s, rs, what, dt, in_place, x, y, ry);
        }
  });
  EXPECT_GT(n, 0);
}

TEST(FastElementwiseRotary, MixedFrequencyGradientMatchesReference) {
  int n = 0;
  ForEachTarget([&](const std::string& target) {
    for (DType dt : kDtypes)
      for (const RotaryCase& c : kRotaryCases) {
        ++n;
        const std::int64_t r = c.r == 0 ? c.D : c.r;
        Rope2dParams p;
        p.variant = Rope2dVariant::kMixed;
        p.rope.layout = n % 2 ? RopeLayout::kInterleaved : RopeLayout::kHalf;
        p.rope.rotary_dim = c.r;
        const std::vector<std::int64_t> shape = {c.B, c.L, c.H, c.D};
        Buf x(dt, shape, n % 3 == 0), dy(dt, shape, false, n % 2 == 0), dx(dt, shape, n % 4 == 1);
        x.fill(randn(static_cast<std::size_t>(c.B * c.L * c.H * c.D), 3400 + n));
        dy.fill(randn(static_cast<std::size_t>(c.B * c.L * c.H * c.D), 3500 + n));
        Buf f(DType::kF64, {2, c.H, r / 2}), df(DType::kF64, {2, c.H, r / 2}), wdf(DType::kF64, {2, c.H, r / 2});
        f.fill(randn(static_cast<std::size_t>(2 * c.H * r / 2), 3600 + n, 0.3));
        std::vector<std::int64_t> ids(static_cast<std::size_t>(c.B * 2 * c.L));
        for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * 7) % 23);
        const Positions pos{View::contiguous(ids.data(), DType::kI64, {c.B, 2, c.L}), 0};
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          df.reset();
          const std::string what = target + " " + dtype_name(dt) + " case " + std::to_string(n) + " threads " +
                                   std::to_string(threads);
          ASSERT_TRUE(rope2d_backward(p, dy.v, pos, f.v, dx.v, x.v, df.v).ok()) << what;
          ASSERT_TRUE(reference::rope2d_backward(p, dy.v, pos, f.v, View{}, x.v, wdf.v).ok());
          const std::vector<double> want = wdf.values();
          double amax = 1e-30;
          for (double v : want) amax = std::max(amax, std::fabs(v));
          // float math on the same stored values: each term to ~1e-6 relative, the sums compared
          // relative to their largest entry
          EXPECT_TRUE(AllClose(df.values(), want, 2e-5 * amax, 1e-5)) << what;
          EXPECT_TRUE(df.guards_ok() && dx.guards_ok()) << what;
        }
        set_num_threads(0);
      }
  });
}

}  // namespace
}  // namespace posenc
