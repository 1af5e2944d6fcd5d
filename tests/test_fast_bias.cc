// The logit biases' fast paths (ALiBi, T5, KERPLE, Sandwich, FIRE) and their backward reductions
// (ALiBi's and T5's dweights, KERPLE's dr1 and dr2, FIRE's gradients from its segment moments)
// against posenc::reference::, on every SIMD target here. Never times anything.
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

// The backward tests' geometries: heads, queries, keys, query offset (−1: N − M) and key offset.
struct Geometry {
  std::int64_t H, M, N, qo, ko;
};
const Geometry kBackwardCases[] = {{1, 1, 1, 0, 0}, {4, 3, 19, -1, 0}, {6, 19, 3, 0, 7}, {2, 64, 130, 0, 0}, {2, 1, 989, 988, 0}};

// The relative spacing of dt's values (2⁻²³, 2⁻⁷, 2⁻¹⁰): one rounding to dt is within half of it.
double ulp(DType dt) { return dt == DType::kF32 ? 0x1p-23 : dt == DType::kBF16 ? 0x1p-7 : 0x1p-10; }

// body(what, dt, n, g) for every SIMD target, dtype and backward geometry, n counting the calls from 1.
template <class Body>
void ForEachBackwardCase(const Body& body) {
  int n = 0;
  ForEachTarget([&](const std::string& target) {
    for (DType dt : kDtypes)
      for (const Geometry& gg : kBackwardCases) {
        ++n;
        const BiasGeometry g{gg.H, gg.M, gg.N, gg.qo < 0 ? gg.N - gg.M : gg.qo, gg.ko};
        body(target + " " + dtype_name(dt) + " case " + std::to_string(n), dt, n, g);
      }
  });
}

// The backward reductions: dbias summed per distance (vectorised, double) then per parameter,
// against the reference's double sums over (i, j) in another order. Both sums of the same n = M·N
// terms differ by at most 2·n·2⁻⁵³·Σ|term| (each within n·2⁻⁵³·Σ|term| of the exact sum), then one
// rounding to the dtype each: |fast − ref| ≤ 2·n·2⁻⁵³·Σ|term|·(1 + ulp) + one ulp of the dtype at
// the value.
TEST(FastElementwiseBias, BackwardsMatchTheReference) {
  ForEachBackwardCase([&](const std::string& what, DType dt, int n, const BiasGeometry& g) {
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
  ForEachBackwardCase([&](const std::string& what, DType dt, int n, const BiasGeometry& g) {
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
    if (n % 3 != 0) return;  // FIRE's backward has no SIMD: a third of the cases suffice
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


}  // namespace
}  // namespace posenc
