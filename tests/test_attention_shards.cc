// attention_backward_from_stats: the keys split into 2 or 3 shards (each at its k_offset, the queries
// at the whole call's q_offset), each shard's (out_s, lse_s) from attention_forward merged by lse into
// the whole attention's (out, lse), then each shard's backward under those global statistics. Summed
// over the shards (dq, parameter gradients) and concatenated (dk, dv) they must equal the unsharded
// backward: float64 (the reference path) to 1e-10, float32 at sizes where the dispatcher runs the
// fused kernel on every shard (B·Hq·M·N_s ≥ 2^14) against the float64 reference of the rounded
// inputs, to the fused kernels' float32 tolerances. Encodings: nope, rope, alibi (symmetric,
// nonsymmetric, learned), t5, kerple, sandwich, fire, xl, causal or not, with query rows before every
// key (every key masked under causal). Refusals: cope; dynamic rope without seq_len; bad out / lse.
#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "posenc/attention.h"
#include "testing.h"

namespace posenc {
namespace {

using ::posenc::testing::AllClose;
using ::posenc::testing::randn;
using I = std::int64_t;
using Vec = std::vector<double>;

std::size_t ix(I i) { return static_cast<std::size_t>(i); }
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Case {
  std::string name;
  Encoding enc = Encoding::kNope;
  AlibiVariant alibi = AlibiVariant::kSymmetric;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> cases() {
  return {{"nope", Encoding::kNope},
          {"rope", Encoding::kRope},
          {"alibi", Encoding::kAlibi},
          {"alibi_nonsymmetric", Encoding::kAlibi, AlibiVariant::kNonsymmetric},
          {"alibi_learned", Encoding::kAlibi, AlibiVariant::kLearned},
          {"t5", Encoding::kT5},
          {"kerple", Encoding::kKerple},
          {"sandwich", Encoding::kSandwich},
          {"fire", Encoding::kFire},
          {"xl", Encoding::kXL}};
}

struct Shape {
  I B, M, N, Hq, Hkv, D;
  I k_off;
  I q_off;
  std::vector<I> shards;  // key counts, summing to N
};

// One problem: q, k, v, dout and the encoding's tensors (float64 values; q/k/v stored in dtype dt).
struct Problem {
  Shape s;
  AttentionParams p;
  DType dt;
  Vec q, k, v, dout;
  // The learned tensors by name, with their shapes.
  std::vector<std::pair<std::string, std::pair<Vec, std::vector<I>>>> par;

  Problem(const Case& c, const Shape& sh, bool causal, DType t, std::uint64_t seed) : s(sh), dt(t) {
    p.encoding = c.enc;
    p.causal = causal;
    p.k_offset = sh.k_off;
    p.q_offset = sh.q_off;
    p.alibi.variant = c.alibi;
    p.t5.num_buckets = 16;
    p.t5.max_distance = 40;
    p.sandwich.sinusoid_dim = 16;
    q = round(randn(ix(sh.B * sh.M * sh.Hq * sh.D), seed + 1));
    k = round(randn(ix(sh.B * sh.N * sh.Hkv * sh.D), seed + 2));
    v = round(randn(ix(sh.B * sh.N * sh.Hkv * sh.D), seed + 3));
    dout = round(randn(ix(sh.B * sh.M * sh.Hq * sh.D), seed + 4));
    const I H = sh.Hq, W = 9, R = 8;
    auto add = [&](const char* name, Vec x, std::vector<I> shape) { par.push_back({name, {std::move(x), shape}}); };
    if (c.enc == Encoding::kAlibi && c.alibi == AlibiVariant::kLearned) add("weights", randn(ix(2 * H), seed + 5), {2, H});
    if (c.enc == Encoding::kT5) add("weights", randn(ix(16 * H), seed + 5), {16, H});
    if (c.enc == Encoding::kKerple) {
      Vec r1 = randn(ix(H), seed + 6), r2 = randn(ix(H), seed + 7);
      for (double& x : r1) x = 0.1 + 1.5 * (0.5 + 0.5 * std::tanh(x));
      for (double& x : r2) x = 0.05 + 1.9 * (0.5 + 0.5 * std::tanh(x));
      add("r1", r1, {H});
      add("r2", r2, {H});
    }
    if (c.enc == Encoding::kFire) {
      add("w1", randn(ix(W), seed + 8, 1.5), {W});
      add("b1", randn(ix(W), seed + 9, 0.7), {W});
      add("w2", randn(ix(H * W), seed + 10, 0.8), {H, W});
      add("b2", randn(ix(H), seed + 11, 0.5), {H});
      add("c", {0.15}, {1});
      add("threshold", {sh.k_off + 20.5}, {1});
    }
    if (c.enc == Encoding::kXL) {
      add("u", randn(ix(H * sh.D), seed + 12, 0.5), {H, sh.D});
      add("v", randn(ix(H * sh.D), seed + 13, 0.5), {H, sh.D});
      add("rel_proj", randn(ix(H * sh.D * R), seed + 14, 0.5), {H, sh.D, R});
    }
  }

  Vec round(Vec x) const {
    if (dt == DType::kF32)
      for (double& e : x) e = static_cast<float>(e);
    return x;
  }

  // Views of par[i] (float64) in the slot of EncodingTensors / EncodingGrads its name gives.
  template <class T>
  static void place(T* t, const std::string& n, const View& w) {
    if (n == "weights") t->weights = w;
    if (n == "r1") t->r1 = w;
    if (n == "r2") t->r2 = w;
    if (n == "u") t->u = w;
    if (n == "v") t->v = w;
    if (n == "rel_proj") t->rel_proj = w;
    if (n == "w1") t->fire.w1 = w;
    if (n == "b1") t->fire.b1 = w;
    if (n == "w2") t->fire.w2 = w;
    if (n == "b2") t->fire.b2 = w;
    if (n == "c") t->fire.c = w;
    if (n == "threshold") t->fire.threshold = w;
  }
  EncodingTensors tensors() {
    EncodingTensors t;
    for (auto& [n, x] : par) place(&t, n, View::contiguous(x.first.data(), DType::kF64, x.second));
    return t;
  }
  // Gradient buffers shaped as par, and the EncodingGrads over them.
  EncodingGrads grads(std::vector<Vec>* bufs) {
    EncodingGrads g;
    bufs->clear();
    bufs->reserve(par.size());
    for (auto& [n, x] : par) {
      bufs->emplace_back(x.first.size(), 0.0);
      place(&g, n, View::contiguous(bufs->back().data(), DType::kF64, x.second));
    }
    return g;
  }
};

// Storage in dtype dt (float32 or float64) of a double vector, and back.
struct Buf {
  DType dt;
  Vec d;
  std::vector<float> f;
  std::vector<I> shape;
  Buf(DType t, const Vec& x, std::vector<I> sh) : dt(t), d(x), f(x.begin(), x.end()), shape(std::move(sh)) {}
  View view() {
    return dt == DType::kF32 ? View::contiguous(f.data(), DType::kF32, shape)
                             : View::contiguous(d.data(), DType::kF64, shape);
  }
  Vec values() const { return dt == DType::kF32 ? Vec(f.begin(), f.end()) : d; }
};

// Rows [j0, j0 + n) of a [B, N, H, D] tensor.
Vec key_rows(const Vec& x, I B, I N, I HD, I j0, I n) {
  Vec r;
  for (I b = 0; b < B; ++b)
    r.insert(r.end(), x.begin() + (b * N + j0) * HD, x.begin() + (b * N + j0 + n) * HD);
  return r;
}

double amax(const Vec& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

struct Tol {
  double atol, rtol;  // atol relative to the largest |want| of the tensor
};
::testing::AssertionResult Close(const Vec& got, const Vec& want, Tol t) {
  return AllClose(got, want, t.atol * std::max(amax(want), 1e-30), t.rtol);
}

struct Result {
  Vec out, lse, dq, dk, dv;
  std::vector<Vec> dpar;
  std::vector<Vec> dpar_abs;  // sharded: Σ over the shards of |partial sum|, the scale of its rounding
};

// The unsharded forward and backward by the float64 reference (on the values q, k, v hold).
Result whole(Problem& pr) {
  const Shape& s = pr.s;
  Result r;
  r.out.assign(pr.q.size(), 0.0);
  r.lse.assign(ix(s.B * s.Hq * s.M), 0.0);
  r.dq.assign(pr.q.size(), 0.0);
  r.dk.assign(pr.k.size(), 0.0);
  r.dv.assign(pr.v.size(), 0.0);
  auto V = [](Vec& x, std::vector<I> sh) { return View::contiguous(x.data(), DType::kF64, sh); };
  const std::vector<I> qs{s.B, s.M, s.Hq, s.D}, ks{s.B, s.N, s.Hkv, s.D};
  const EncodingTensors t = pr.tensors();
  EXPECT_TRUE(reference::attention_forward(pr.p, V(pr.q, qs), V(pr.k, ks), V(pr.v, ks), t, V(r.out, qs),
                                           V(r.lse, {s.B, s.Hq, s.M})).ok());
  const EncodingGrads g = pr.grads(&r.dpar);
  EXPECT_TRUE(reference::attention_backward(pr.p, V(pr.q, qs), V(pr.k, ks), V(pr.v, ks), t, V(pr.dout, qs),
                                            V(r.dq, qs), V(r.dk, ks), V(r.dv, ks), g).ok());
  return r;
}

// Forward per shard (the public dispatcher), merged by lse; then the backward of every shard under
// the merged statistics, dq and parameter gradients summed, dk and dv concatenated.
Result sharded(Problem& pr) {
  const Shape& s = pr.s;
  const DType dt = pr.dt;
  const I HD = s.Hkv * s.D;
  const std::vector<I> qs{s.B, s.M, s.Hq, s.D};
  const EncodingTensors t = pr.tensors();
  Buf q(dt, pr.q, qs), dout(dt, pr.dout, qs);
  Result r;
  Vec lse(ix(s.B * s.Hq * s.M), kNegInf), acc(pr.q.size(), 0.0);
  std::vector<Vec> out_s, lse_s;
  I j0 = 0;
  for (I n : s.shards) {  // forward of each shard
    AttentionParams p = pr.p;
    p.k_offset = s.k_off + j0;
    const std::vector<I> ks{s.B, n, s.Hkv, s.D};
    Buf k(dt, key_rows(pr.k, s.B, s.N, HD, j0, n), ks), v(dt, key_rows(pr.v, s.B, s.N, HD, j0, n), ks);
    Buf o(dt, Vec(pr.q.size(), 0.0), qs);
    lse_s.emplace_back(lse.size(), 0.0);
    EXPECT_TRUE(attention_forward(p, q.view(), k.view(), v.view(), t, o.view(),
                                  View::contiguous(lse_s.back().data(), DType::kF64, {s.B, s.Hq, s.M})).ok());
    out_s.push_back(o.values());
    for (std::size_t e = 0; e < lse.size(); ++e) {  // log-sum-exp over the shards
      const double a = lse[e], b = lse_s.back()[e], m = std::max(a, b);
      if (m != kNegInf) lse[e] = m + std::log(std::exp(a - m) + std::exp(b - m));
    }
    j0 += n;
  }
  for (std::size_t si = 0; si < out_s.size(); ++si)  // out = Σ_s exp(lse_s − lse)·out_s
    for (I b = 0; b < s.B; ++b)
      for (I i = 0; i < s.M; ++i)
        for (I h = 0; h < s.Hq; ++h) {
          const std::size_t at = ix((b * s.Hq + h) * s.M + i);
          if (lse_s[si][at] == kNegInf) continue;
          const double w = std::exp(lse_s[si][at] - lse[at]);
          for (I e = 0; e < s.D; ++e) {
            const std::size_t o = ix(((b * s.M + i) * s.Hq + h) * s.D + e);
            acc[o] += w * out_s[si][o];
          }
        }
  Buf out(dt, acc, qs);
  r.out = out.values();
  r.lse = lse;
  r.dq.assign(pr.q.size(), 0.0);
  j0 = 0;
  std::vector<Vec> bufs;
  for (I n : s.shards) {  // backward of each shard under the global statistics
    AttentionParams p = pr.p;
    p.k_offset = s.k_off + j0;
    const std::vector<I> ks{s.B, n, s.Hkv, s.D};
    Buf k(dt, key_rows(pr.k, s.B, s.N, HD, j0, n), ks), v(dt, key_rows(pr.v, s.B, s.N, HD, j0, n), ks);
    Buf dq(dt, Vec(pr.q.size(), 0.0), qs), dk(dt, Vec(k.d.size(), 0.0), ks), dv(dt, Vec(k.d.size(), 0.0), ks);
    const EncodingGrads g = pr.grads(&bufs);
    const Status st = attention_backward_from_stats(
        p, q.view(), k.view(), v.view(), t, out.view(),
        View::contiguous(lse.data(), DType::kF64, {s.B, s.Hq, s.M}), dout.view(), dq.view(), dk.view(),
        dv.view(), g);
    EXPECT_TRUE(st.ok()) << st.message();
    const Vec dqs = dq.values(), dks = dk.values(), dvs = dv.values();
    for (std::size_t e = 0; e < dqs.size(); ++e) r.dq[e] += dqs[e];
    if (r.dpar.empty()) r.dpar.assign(bufs.size(), Vec{}), r.dpar_abs.assign(bufs.size(), Vec{});
    for (std::size_t i = 0; i < bufs.size(); ++i) {
      r.dpar[i].resize(bufs[i].size(), 0.0);
      r.dpar_abs[i].resize(bufs[i].size(), 0.0);
      for (std::size_t e = 0; e < bufs[i].size(); ++e) {
        r.dpar[i][e] += bufs[i][e];
        r.dpar_abs[i][e] += std::fabs(bufs[i][e]);
      }
    }
    r.dk.resize(pr.k.size());
    r.dv.resize(pr.v.size());
    for (I b = 0; b < s.B; ++b) {  // rows j0 .. j0 + n of batch row b
      std::copy(dks.begin() + b * n * HD, dks.begin() + (b + 1) * n * HD, r.dk.begin() + (b * s.N + j0) * HD);
      std::copy(dvs.begin() + b * n * HD, dvs.begin() + (b + 1) * n * HD, r.dv.begin() + (b * s.N + j0) * HD);
    }
    j0 += n;
  }
  return r;
}

void compare(Problem& pr, Tol out_tol, double lse_tol, Tol grad_tol, Tol par_tol) {
  const Result want = whole(pr), got = sharded(pr);
  EXPECT_TRUE(Close(got.out, want.out, out_tol)) << "out";
  EXPECT_TRUE(AllClose(got.lse, want.lse, lse_tol, lse_tol)) << "lse";
  EXPECT_TRUE(Close(got.dq, want.dq, grad_tol)) << "dq";
  EXPECT_TRUE(Close(got.dk, want.dk, grad_tol)) << "dk";
  EXPECT_TRUE(Close(got.dv, want.dv, grad_tol)) << "dv";
  ASSERT_EQ(got.dpar.size(), pr.par.size());
  // A parameter gradient may cancel to about 0 over the whole row (FIRE's b2: Σ_j dl_ij = 0) while
  // each shard's partial sum does not: atol scales with the larger of |want| and the partials'.
  for (std::size_t i = 0; i < pr.par.size(); ++i)
    EXPECT_TRUE(AllClose(got.dpar[i], want.dpar[i],
                         par_tol.atol * std::max({amax(want.dpar[i]), amax(got.dpar_abs[i]), 1e-30}), par_tol.rtol))
        << "d" << pr.par[i].first;
  // The comparison is not vacuous: the gradients are not all zero.
  EXPECT_GT(amax(want.dk), 1e-3);
}

class Shards : public ::testing::TestWithParam<Case> {};

// Float64: the reference path, to 1e-10; three uneven shards, grouped heads, B = 2; the keys after
// the queries' start (q_off = k_off + N − M) and, second shape, queries whose first rows precede
// every key (causal: rows with every key masked in every shard).
TEST_P(Shards, Float64MatchesWhole) {
  const std::vector<Shape> shapes{{2, 7, 11, 4, 2, 8, 5, 9, {4, 3, 4}}, {1, 9, 10, 2, 1, 6, 30, 28, {6, 4}}};
  for (const Shape& sh : shapes)
    for (bool causal : {false, true}) {
      SCOPED_TRACE(GetParam().name + (causal ? " causal" : "") + " M=" + std::to_string(sh.M));
      Problem pr(GetParam(), sh, causal, DType::kF64, 100);
      compare(pr, Tol{1e-12, 1e-10}, 1e-12, Tol{1e-12, 1e-10}, Tol{1e-12, 1e-10});
    }
}

// Float32 at sizes where every shard runs the fused kernel (B·Hq·M·N_s ≥ 2^14), against the float64
// reference of the same rounded inputs.
TEST_P(Shards, Float32FusedMatchesWhole) {
  const Shape sh{1, 130, 300, 4, 2, 32, 17, 17, {100, 90, 110}};
  for (bool causal : {false, true}) {
    SCOPED_TRACE(GetParam().name + (causal ? " causal" : ""));
    Problem pr(GetParam(), sh, causal, DType::kF32, 200);
    compare(pr, Tol{2e-6, 2e-5}, 1e-5, Tol{5e-5, 2e-4}, Tol{5e-5, 5e-4});
  }
}

INSTANTIATE_TEST_SUITE_P(Encodings, Shards, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The refusals: cope (a key's position counts the later keys' gates), a length-reading RoPE scheme
// without seq_len, and out / lse of the wrong shape or dtype.
TEST(ShardsRefuse, CopeDynamicRopeAndBadStats) {
  const I B = 1, M = 4, N = 5, H = 2, D = 4;
  Vec q = randn(ix(B * M * H * D), 1), k = randn(ix(B * N * H * D), 2), v = randn(ix(B * N * H * D), 3);
  Vec out(q.size()), dout = randn(q.size(), 4), lse(ix(B * H * M), 0.0), dq(q.size()), table = randn(ix(3 * D), 5);
  Vec lse_bad(ix(B * H * (M + 1)), 0.0);
  std::vector<float> out32(q.size());
  auto V = [](Vec& x, std::vector<I> sh) { return View::contiguous(x.data(), DType::kF64, sh); };
  const std::vector<I> qs{B, M, H, D}, ks{B, N, H, D};
  AttentionParams p;
  p.encoding = Encoding::kCope;
  EncodingTensors t;
  t.table = V(table, {3, D});
  Status st = attention_backward_from_stats(p, V(q, qs), V(k, ks), V(v, ks), t, V(out, qs), V(lse, {B, H, M}),
                                            V(dout, qs), V(dq, qs), View{}, View{}, EncodingGrads{});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("encoding"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("cope"), std::string::npos) << st.message();
  st = reference::attention_backward_from_stats(p, V(q, qs), V(k, ks), V(v, ks), t, V(out, qs), V(lse, {B, H, M}),
                                                V(dout, qs), V(dq, qs), View{}, View{}, EncodingGrads{});
  EXPECT_FALSE(st.ok());

  p = AttentionParams{};
  p.encoding = Encoding::kRope;
  p.rope.rope_type = RopeType::kDynamic;
  p.rope.factor = 2;
  p.rope.original_max_position = 4;
  st = attention_backward_from_stats(p, V(q, qs), V(k, ks), V(v, ks), {}, V(out, qs), V(lse, {B, H, M}),
                                     V(dout, qs), V(dq, qs), View{}, View{}, EncodingGrads{});
  EXPECT_NE(st.message().find("seq_len"), std::string::npos) << st.message();
  p.rope.seq_len = 64;  // set: accepted
  st = attention_backward_from_stats(p, V(q, qs), V(k, ks), V(v, ks), {}, V(out, qs), V(lse, {B, H, M}),
                                     V(dout, qs), V(dq, qs), View{}, View{}, EncodingGrads{});
  EXPECT_TRUE(st.ok()) << st.message();

  p = AttentionParams{};
  st = attention_backward_from_stats(p, V(q, qs), V(k, ks), V(v, ks), {}, View{}, V(lse, {B, H, M}),
                                     V(dout, qs), V(dq, qs), View{}, View{}, EncodingGrads{});
  EXPECT_NE(st.message().find("out"), std::string::npos) << st.message();
  st = attention_backward_from_stats(p, V(q, qs), V(k, ks), V(v, ks), {},
                                     View::contiguous(out32.data(), DType::kF32, qs), V(lse, {B, H, M}),
                                     V(dout, qs), V(dq, qs), View{}, View{}, EncodingGrads{});
  EXPECT_NE(st.message().find("out"), std::string::npos) << st.message();
  st = attention_backward_from_stats(p, V(q, qs), V(k, ks), V(v, ks), {}, V(out, qs), V(lse_bad, {B, H, M + 1}),
                                     V(dout, qs), V(dq, qs), View{}, View{}, EncodingGrads{});
  EXPECT_NE(st.message().find("lse"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace posenc
