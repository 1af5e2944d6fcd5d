// require_finite (posenc/view.h): the check the bias and attention entry points run on their learned
// tensors. Finite views pass whatever their dtype; the first NaN or ±inf, in the view's own C order
// (strides followed), is reported with its index.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/overlap.h"
#include "posenc/absolute.h"
#include "posenc/attention.h"
#include "posenc/bias.h"
#include "posenc/half.h"
#include "posenc/rotary.h"
#include "posenc/view.h"
#include "testing.h"

namespace posenc {
namespace {

using testing::V;

std::string what_of(const Status& s) { return s.ok() ? std::string("ok") : s.what(); }

TEST(RequireFinite, FiniteViewsPass) {
  std::vector<double> d = {0.0, -1.0, 1e308, -1e-308, 5.0, 6.0};
  std::vector<float> f = {0.0f, 3.4e38f, -3.4e38f, 1e-45f};
  EXPECT_TRUE(require_finite("w", V(d, {2, 3})).ok());
  EXPECT_TRUE(require_finite("w", V(f, {4})).ok());
  EXPECT_TRUE(require_finite("w", View{}).ok());  // absent: nothing to scan (shape checks name it)
  std::vector<double> empty;
  EXPECT_TRUE(require_finite("w", View::contiguous(empty.data(), DType::kF64, {0, 3})).ok());
}

TEST(RequireFinite, NamesTheArgumentTheValueAndItsIndex) {
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    double bad;
    const char* shown;
  };
  for (const Case& c : {Case{std::nan(""), "nan"}, Case{inf, "inf"}, Case{-inf, "-inf"}}) {
    std::vector<double> d(24, 0.5);
    d[1 * 12 + 0 * 4 + 2] = c.bad;  // [1, 0, 2] of [2, 3, 4]
    d[23] = std::nan("");           // [1, 2, 3], later: not the first
    const Status s = require_finite("rel_proj", V(d, {2, 3, 4}));
    EXPECT_EQ(s.arg(), "rel_proj");
    EXPECT_EQ(what_of(s), std::string("expected finite values, got ") + c.shown + " at [1, 0, 2]");
    std::vector<float> f(6, 1.0f);
    f[4] = static_cast<float>(c.bad);
    EXPECT_EQ(what_of(require_finite("u", V(f, {2, 3}))),
              std::string("expected finite values, got ") + c.shown + " at [1, 1]");
  }
}

// Contiguous float32 / float64 views are scanned by their bits, eight words at a time: a bad value at
// any place (in the eight-word body or the tail) is found, the largest finite values are not bad.
TEST(RequireFinite, ContiguousScanFindsEveryPlace) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {std::nan(""), inf, -inf})
    for (std::size_t at = 0; at < 37; ++at) {
      std::vector<double> d(37, -std::numeric_limits<double>::max());
      std::vector<float> f(37, std::numeric_limits<float>::max());
      d[at] = bad;
      f[at] = static_cast<float>(bad);
      const std::string where = " at [" + std::to_string(at) + "]";
      EXPECT_NE(what_of(require_finite("w", V(d, {37}))).find(where), std::string::npos) << at;
      EXPECT_NE(what_of(require_finite("w", V(f, {37}))).find(where), std::string::npos) << at;
      d[at] = std::numeric_limits<double>::denorm_min();
      f[at] = -std::numeric_limits<float>::max();
      EXPECT_TRUE(require_finite("w", V(d, {37})).ok()) << at;
      EXPECT_TRUE(require_finite("w", V(f, {37})).ok()) << at;
    }
}

TEST(RequireFinite, FollowsStridesAndHalfTypes) {
  // A transposed view of a [3, 2] buffer: view element [i, j] is buffer [j, i].
  std::vector<double> buf = {1, 2, 3, 4, std::nan(""), 6};  // buffer [2, 0] is NaN
  View t = View::contiguous(buf.data(), DType::kF64, {2, 3});
  t.strides = {1, 2};  // [i, j] at i + 2j: view [0, 2] is buf[4]
  EXPECT_EQ(what_of(require_finite("table", t)), "expected finite values, got nan at [0, 2]");
  // bfloat16 storage of +inf.
  std::vector<bf16> h = {to_bf16(1.0f), to_bf16(std::numeric_limits<float>::infinity())};
  EXPECT_EQ(what_of(require_finite("weights", View::contiguous(h.data(), DType::kBF16, {2}))),
            "expected finite values, got inf at [1]");
}

// An empty tensor's inner dimensions may multiply past int64 (an .npy header can say so): the
// strides within int64 are C-order, those beyond it 0, and nothing overflows (UBSan checks).
TEST(ViewContiguous, EmptyShapeWhoseProductOverflows) {
  const std::int64_t big = std::int64_t{1} << 31;
  const View v = View::contiguous(nullptr, DType::kF32, {0, big, big, big});
  EXPECT_EQ(v.numel(), 0);
  EXPECT_EQ(v.strides[3], 1);
  EXPECT_EQ(v.strides[2], big);
  EXPECT_EQ(v.strides[1], big * big);
  EXPECT_EQ(v.strides[0], 0);
}

// ==== overlap (core/overlap.h) =====================================================================

View strided(float* base, std::int64_t offset, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides) {
  View v = View::contiguous(base + offset, DType::kF32, shape);
  for (std::size_t k = 0; k < strides.size(); ++k) v.strides[k] = strides[k];
  return v;
}

// The element addresses of v, by brute force.
std::set<const char*> addresses(const View& v) {
  std::set<const char*> out;
  std::vector<std::int64_t> i(static_cast<std::size_t>(v.ndim), 0);
  if (v.numel() == 0) return out;
  for (;;) {
    std::int64_t off = 0;
    for (int k = 0; k < v.ndim; ++k) off += i[static_cast<std::size_t>(k)] * v.strides[k];
    out.insert(static_cast<const char*>(v.data) + off * 4);
    int k = v.ndim - 1;
    for (; k >= 0 && ++i[static_cast<std::size_t>(k)] == v.shape[k]; --k) i[static_cast<std::size_t>(k)] = 0;
    if (k < 0) return out;
  }
}

TEST(Overlap, SlicesOfOneBufferAndTheCasesThatMeet) {
  std::vector<float> buf(4096);
  float* b = buf.data();
  // a fused QKV [B = 2, L = 3, 3, H = 2, D = 4]: q, k and v interleave without sharing an element
  const std::vector<std::int64_t> st = {3 * 3 * 2 * 4, 3 * 2 * 4, 4, 1}, sh = {2, 3, 2, 4};
  const View q = strided(b, 0, sh, st), k = strided(b, 8, sh, st), v = strided(b, 16, sh, st);
  EXPECT_FALSE(fast::overlap(q, k));
  EXPECT_FALSE(fast::overlap(k, v));
  EXPECT_FALSE(fast::overlap(v, q));
  EXPECT_TRUE(fast::overlap(q, q));
  EXPECT_TRUE(fast::overlap(q, strided(b, 7, sh, st)));  // q's last row of a head meets it
  EXPECT_TRUE(fast::overlap(q, strided(b, 1, sh, st)));
  // even and odd elements
  EXPECT_FALSE(fast::overlap(strided(b, 0, {100}, {2}), strided(b, 1, {100}, {2})));
  EXPECT_TRUE(fast::overlap(strided(b, 0, {100}, {2}), strided(b, 2, {100}, {2})));
  // contiguous views of other shapes or dtypes whose extents meet
  View d = View::contiguous(b + 10, DType::kF64, {4});
  EXPECT_TRUE(fast::overlap(View::contiguous(b, DType::kF32, {4, 4}), d));
  EXPECT_FALSE(fast::overlap(View::contiguous(b, DType::kF32, {10}), d));
  // absent or empty views meet nothing
  EXPECT_FALSE(fast::overlap(View{}, q));
  EXPECT_FALSE(fast::overlap(strided(b, 0, {0, 4}, {4, 1}), q));
}

// An output whose strides put elements at one address (a stride of 0, two strides of one size) is an
// error naming it, at every kind of entry point; inputs may broadcast.
TEST(RequireOutput, EntryPointsRefuseOutputsWhoseElementsShareAddresses) {
  std::vector<float> x(64, 0.5f), y(64, 7.f);
  View in = View::contiguous(x.data(), DType::kF32, {1, 2, 2, 8}), out = View::contiguous(y.data(), DType::kF32, {1, 2, 2, 8});
  View zero = out;
  zero.strides[1] = 0;
  EXPECT_EQ(rope2d_forward({}, in, {}, {}, zero).arg(), "y");
  View same = out;
  same.shape = {1, 2, 2, 8, 0, 0}, same.strides = {32, 8, 8, 1, 0, 0};  // l and h at one stride
  EXPECT_EQ(rope2d_forward({}, in, {}, {}, same).arg(), "y");
  View bcast = in;
  bcast.strides[1] = 0;  // an input may
  EXPECT_TRUE(rope2d_forward({}, bcast, {}, {}, out).ok());
  std::fill(y.begin(), y.end(), 7.f);
  BiasGeometry g;
  g.heads = 2, g.q_len = 2, g.k_len = 4;
  View bias = View::contiguous(y.data(), DType::kF32, {2, 2, 4});
  bias.strides[0] = 0;
  EXPECT_EQ(alibi_bias({}, g, {}, {}, bias).arg(), "out");
  View dtable = View::contiguous(y.data(), DType::kF32, {4, 8});
  dtable.strides[0] = 0;
  EXPECT_EQ(learned_backward({}, View::contiguous(x.data(), DType::kF32, {1, 2, 8}), View::contiguous(x.data(), DType::kF32, {4, 8}),
                             {}, View{}, dtable).arg(), "dtable");
  std::vector<double> qd(64, 0.5), od(64, 7.0);
  View q = View::contiguous(qd.data(), DType::kF64, {1, 2, 2, 8}), o = View::contiguous(od.data(), DType::kF64, {1, 2, 2, 8});
  o.strides[2] = 0;
  EXPECT_EQ(attention_forward({}, q, q, q, {}, o).arg(), "out");
  for (float e : y) EXPECT_EQ(e, 7.f);
  for (double e : od) EXPECT_EQ(e, 7.0);
}

// Random pairs of one layout (slices of one buffer), against the addresses counted one by one.
TEST(Overlap, OneLayoutAgreesWithBruteForce) {
  std::vector<float> buf(1 << 16);
  std::mt19937_64 rng(7);
  const auto u = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  int met = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int nd = static_cast<int>(u(1, 4));
    std::vector<std::int64_t> st(static_cast<std::size_t>(nd)), sa(st.size()), sb(st.size());
    for (int k = 0; k < nd; ++k) {
      st[static_cast<std::size_t>(k)] = u(1, 40);
      sa[static_cast<std::size_t>(k)] = u(1, 5);
      sb[static_cast<std::size_t>(k)] = u(1, 5);
    }
    const View a = strided(buf.data(), u(0, 200), sa, st), b = strided(buf.data(), u(0, 200), sb, st);
    std::set<const char*> x = addresses(a), y = addresses(b), both;
    std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::inserter(both, both.begin()));
    ASSERT_EQ(fast::overlap(a, b), !both.empty()) << "trial " << trial;
    met += !both.empty();
  }
  EXPECT_GT(met, 300);  // both answers well represented
  EXPECT_LT(met, 2700);
}

}  // namespace
}  // namespace posenc
