// Absolute encodings: sinusoidal (Vaswani et al. 2017, §3.5) and learned (BERT / GPT-2).
// Every expectation is computed here, independently of src/enc (or typed in from the articles).
#include <cmath>
#include <cstdint>
#include <vector>

#include "posenc/absolute.h"
#include "testing.h"

namespace posenc {
namespace {

using testing::AllClose;
using testing::GradCheck;
using testing::V;
using testing::dot;
using testing::randn;
using testing::to_float;

std::vector<double> as_doubles(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// PE[p, :] written as the code of “Positional Encoding” (docs/articles.md) does it:
// div_term = exp(2i·(−ln(base)/D)).
std::vector<double> pe_row(double p, std::int64_t D, double base) {
  std::vector<double> row(static_cast<std::size_t>(D));
  for (std::int64_t i = 0; i < D / 2; ++i) {
    const double div_term = std::exp(static_cast<double>(2 * i) * -(std::log(base) / static_cast<double>(D)));
    row[static_cast<std::size_t>(2 * i)] = std::sin(p * div_term);
    row[static_cast<std::size_t>(2 * i + 1)] = std::cos(p * div_term);
  }
  return row;
}

// ---- sinusoidal ---------------------------------------------------------------------------------

// “三角函数式位置编码” (docs/articles.md): getPositionEncoding(seq_len=4, d=4, n=100) prints this matrix ("I am a robot").
const std::vector<double> kArticleMatrix = {
    0.,         1.,          0.,         1.,          //
    0.84147098, 0.54030231,  0.09983342, 0.99500417,  //
    0.90929743, -0.41614684, 0.19866933, 0.98006658,  //
    0.14112001, -0.9899925,  0.29552021, 0.95533649,
};

TEST(SinusoidalTable, ArticlesWorkedExampleFloat64) {
  std::vector<double> out(16, 7.0);
  ASSERT_TRUE(sinusoidal_table({.base = 100.0}, {}, V(out, {4, 4})).ok());
  EXPECT_TRUE(AllClose(out, kArticleMatrix, 1e-8, 0));  // printed to 8 decimals
}

TEST(SinusoidalTable, ArticlesWorkedExampleFloat32) {
  std::vector<float> out(16, 7.0f);
  ASSERT_TRUE(sinusoidal_table({.base = 100.0}, {}, V(out, {4, 4})).ok());
  EXPECT_TRUE(AllClose(as_doubles(out), kArticleMatrix, 2e-7, 0));
}

TEST(SinusoidalTable, ExplicitIdsAndOffset) {
  const std::int64_t D = 6;
  std::vector<std::int32_t> ids = {3, 0, 11};
  std::vector<double> out(3 * D);
  Positions pos{View::contiguous(ids.data(), DType::kI32, {3}), 5};  // positions 8, 5, 16
  ASSERT_TRUE(sinusoidal_table({}, pos, V(out, {3, D})).ok());
  std::vector<double> want;
  for (double p : {8.0, 5.0, 16.0}) {
    const std::vector<double> r = pe_row(p, D, 10000.0);
    want.insert(want.end(), r.begin(), r.end());
  }
  EXPECT_TRUE(AllClose(out, want, 1e-12, 0));
}

// PE(p + k) = M_k·PE(p), M_k block-diagonal with blocks [[cos kω, sin kω], [−sin kω, cos kω]] acting on
// (sin pω, cos pω): the angle-sum identities. M_k is built here from ω alone and must not depend on p.
TEST(Sinusoidal, ShiftIsAFixedLinearMapIndependentOfPosition) {
  const std::int64_t D = 8;
  const double base = 10000.0;
  for (std::int64_t k : {1, 3, 17, 250}) {
    std::vector<double> M(static_cast<std::size_t>(D * D), 0.0);
    for (std::int64_t i = 0; i < D / 2; ++i) {
      const double w = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
      const double c = std::cos(static_cast<double>(k) * w), s = std::sin(static_cast<double>(k) * w);
      const std::int64_t a = 2 * i, b = 2 * i + 1;
      M[static_cast<std::size_t>(a * D + a)] = c;
      M[static_cast<std::size_t>(a * D + b)] = s;
      M[static_cast<std::size_t>(b * D + a)] = -s;
      M[static_cast<std::size_t>(b * D + b)] = c;
    }
    for (std::int64_t p : {0, 1, 9, 123, 4000}) {
      std::vector<std::int64_t> ids = {p, p + k};
      std::vector<double> t(static_cast<std::size_t>(2 * D));
      ASSERT_TRUE(sinusoidal_table({.base = base}, {View::contiguous(ids.data(), DType::kI64, {2}), 0},
                                   V(t, {2, D}))
                      .ok());
      std::vector<double> mapped(static_cast<std::size_t>(D), 0.0), shifted(t.begin() + D, t.end());
      for (std::int64_t r = 0; r < D; ++r)
        for (std::int64_t c = 0; c < D; ++c)
          mapped[static_cast<std::size_t>(r)] += M[static_cast<std::size_t>(r * D + c)] * t[static_cast<std::size_t>(c)];
      EXPECT_TRUE(AllClose(shifted, mapped, 1e-12, 0)) << "k=" << k << " p=" << p;
    }
  }
}

TEST(Sinusoidal, ForwardAddsTheTableFloat64AndFloat32) {
  const std::int64_t B = 2, L = 5, D = 6;
  const std::int64_t offset = 3;
  std::vector<double> x = randn(B * L * D, 1);
  std::vector<double> want(x.size());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t l = 0; l < L; ++l) {
      const std::vector<double> r = pe_row(static_cast<double>(offset + l), D, 10000.0);
      for (std::int64_t d = 0; d < D; ++d)
        want[static_cast<std::size_t>((b * L + l) * D + d)] = x[static_cast<std::size_t>((b * L + l) * D + d)] + r[static_cast<std::size_t>(d)];
    }
  std::vector<double> y(x.size());
  ASSERT_TRUE(sinusoidal_forward({}, V(x, {B, L, D}), {{}, offset}, V(y, {B, L, D})).ok());
  EXPECT_TRUE(AllClose(y, want, 1e-12, 1e-12));

  std::vector<float> xf = to_float(x), yf(x.size());
  ASSERT_TRUE(sinusoidal_forward({}, V(xf, {B, L, D}), {{}, offset}, V(yf, {B, L, D})).ok());
  EXPECT_TRUE(AllClose(as_doubles(yf), want, 1e-6, 1e-6));

  // In place: y aliases x.
  ASSERT_TRUE(sinusoidal_forward({}, V(x, {B, L, D}), {{}, offset}, V(x, {B, L, D})).ok());
  EXPECT_TRUE(AllClose(x, want, 1e-12, 1e-12));
}

TEST(Sinusoidal, ForwardWithBatchedPositions) {
  const std::int64_t B = 2, L = 3, D = 4;
  std::vector<double> x = randn(B * L * D, 2);
  std::vector<std::int64_t> ids = {0, 7, 7, 100, 2, 1};
  std::vector<double> y(x.size());
  ASSERT_TRUE(sinusoidal_forward({.base = 100.0}, V(x, {B, L, D}),
                                 {View::contiguous(ids.data(), DType::kI64, {B, L}), 0}, V(y, {B, L, D}))
                  .ok());
  std::vector<double> want = x;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    const std::vector<double> r = pe_row(static_cast<double>(ids[t]), D, 100.0);
    for (std::int64_t d = 0; d < D; ++d) want[t * D + static_cast<std::size_t>(d)] += r[static_cast<std::size_t>(d)];
  }
  EXPECT_TRUE(AllClose(y, want, 1e-12, 1e-12));
}

TEST(Sinusoidal, BackwardPassesDyThrough) {
  const std::int64_t B = 2, L = 3, D = 4;
  std::vector<float> dy = to_float(randn(B * L * D, 3)), dx(dy.size(), 9.0f);
  ASSERT_TRUE(sinusoidal_backward({}, V(dy, {B, L, D}), {{}, 10}, V(dx, {B, L, D})).ok());
  EXPECT_EQ(dx, dy);
}

TEST(Sinusoidal, BadInputsNameTheArgument) {
  std::vector<double> x(2 * 3 * 5, 1.0), y(2 * 3 * 5, 4.0);
  Status s = sinusoidal_forward({}, V(x, {2, 3, 5}), {}, V(y, {2, 3, 5}));
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.arg(), "x");
  EXPECT_EQ(y, std::vector<double>(y.size(), 4.0));  // nothing written

  std::vector<double> t(4 * 5);
  s = sinusoidal_table({}, {}, V(t, {4, 5}));
  EXPECT_EQ(s.arg(), "out");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);

  std::vector<double> x4(2 * 3 * 4, 1.0), y4(2 * 3 * 4), y_short(2 * 2 * 4);
  std::vector<float> y4f(2 * 3 * 4);
  EXPECT_EQ(sinusoidal_forward({}, V(x4, {2, 3, 4}), {}, V(y_short, {2, 2, 4})).arg(), "y");
  EXPECT_EQ(sinusoidal_forward({}, V(x4, {2, 3, 4}), {}, V(y4f, {2, 3, 4})).arg(), "y");
  EXPECT_EQ(sinusoidal_forward({}, V(x4, {6, 4}), {}, V(y4, {6, 4})).arg(), "x");
  EXPECT_EQ(sinusoidal_forward({}, V(x4, {2, 3, 4}), {}, View{}).arg(), "y");
  EXPECT_EQ(sinusoidal_forward({.base = 0.0}, V(x4, {2, 3, 4}), {}, V(y4, {2, 3, 4})).arg(), "base");
  EXPECT_EQ(sinusoidal_forward({.base = NAN}, V(x4, {2, 3, 4}), {}, V(y4, {2, 3, 4})).arg(), "base");
  std::vector<float> fids = {0, 1, 2};
  EXPECT_EQ(sinusoidal_forward({}, V(x4, {2, 3, 4}), {View::contiguous(fids.data(), DType::kF32, {3}), 0},
                               V(y4, {2, 3, 4}))
                .arg(),
            "positions");
  std::vector<std::int32_t> ids4 = {0, 1, 2, 3};
  EXPECT_EQ(sinusoidal_forward({}, V(x4, {2, 3, 4}), {View::contiguous(ids4.data(), DType::kI32, {4}), 0},
                               V(y4, {2, 3, 4}))
                .arg(),
            "positions");
  EXPECT_EQ(sinusoidal_backward({}, V(x4, {2, 3, 4}), {}, V(y4f, {2, 3, 4})).arg(), "dx");
  EXPECT_EQ(sinusoidal_backward({}, V(x, {2, 3, 5}), {}, V(y, {2, 3, 5})).arg(), "dy");
}

// ---- learned ------------------------------------------------------------------------------------

struct LearnedCase {
  std::int64_t B = 2, L = 3, D = 4, max_len = 10;
  std::vector<double> x = randn(static_cast<std::size_t>(B * L * D), 11);
  std::vector<double> table = randn(static_cast<std::size_t>(max_len * D), 12);

  // y = x + E[pos], pos given per token ([B·L]).
  std::vector<double> want(const std::vector<std::int64_t>& pos) const {
    std::vector<double> y = x;
    for (std::int64_t t = 0; t < B * L; ++t)
      for (std::int64_t d = 0; d < D; ++d)
        y[static_cast<std::size_t>(t * D + d)] += table[static_cast<std::size_t>(pos[static_cast<std::size_t>(t)] * D + d)];
    return y;
  }
  Status run(const Positions& pos, std::vector<double>& y) {
    return learned_forward({}, V(x, {B, L, D}), V(table, {max_len, D}), pos, V(y, {B, L, D}));
  }
};

TEST(Learned, ForwardWithFlatInt32PositionsAndOffset) {
  LearnedCase c;
  std::vector<std::int32_t> ids = {7, 0, 7};
  std::vector<double> y(c.x.size());
  ASSERT_TRUE(c.run({View::contiguous(ids.data(), DType::kI32, {3}), 2}, y).ok());  // 9, 2, 9
  EXPECT_TRUE(AllClose(y, c.want({9, 2, 9, 9, 2, 9}), 1e-15, 0));
}

TEST(Learned, ForwardWithBatchedInt64Positions) {
  LearnedCase c;
  std::vector<std::int64_t> ids = {0, 1, 2, 5, 5, 9};
  std::vector<double> y(c.x.size());
  ASSERT_TRUE(c.run({View::contiguous(ids.data(), DType::kI64, {2, 3}), 0}, y).ok());
  EXPECT_TRUE(AllClose(y, c.want(ids), 1e-15, 0));
}

TEST(Learned, ForwardWithOffsetOnlyAndInPlaceAndFloat32) {
  LearnedCase c;
  const std::vector<double> want = c.want({4, 5, 6, 4, 5, 6});
  std::vector<double> y(c.x.size());
  ASSERT_TRUE(c.run({{}, 4}, y).ok());
  EXPECT_TRUE(AllClose(y, want, 1e-15, 0));

  std::vector<float> xf = to_float(c.x), tf = to_float(c.table);
  ASSERT_TRUE(learned_forward({}, V(xf, {2, 3, 4}), V(tf, {10, 4}), {{}, 4}, V(xf, {2, 3, 4})).ok());  // y = x
  EXPECT_TRUE(AllClose(as_doubles(xf), want, 1e-6, 1e-6));
}

TEST(Learned, PositionAtOrBeyondMaxLenIsOutOfRangeAndWritesNothing) {
  LearnedCase c;
  std::vector<double> y(c.x.size(), -3.0);
  std::vector<std::int32_t> ids = {3, 10, 1};
  Status s = c.run({View::contiguous(ids.data(), DType::kI32, {3}), 0}, y);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(s.arg(), "positions");
  EXPECT_NE(s.message().find("10"), std::string::npos) << s.message();
  EXPECT_EQ(y, std::vector<double>(y.size(), -3.0));

  s = c.run({{}, 8}, y);  // 8, 9, 10
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(s.arg(), "positions");
  EXPECT_EQ(y, std::vector<double>(y.size(), -3.0));

  // The backward refuses too, leaving dtable and dx untouched.
  std::vector<double> dtable(c.table.size(), 5.0), dx(c.x.size(), 6.0);
  s = learned_backward({}, V(c.x, {2, 3, 4}), V(c.table, {10, 4}), {{}, 8}, V(dx, {2, 3, 4}),
                       V(dtable, {10, 4}));
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(dtable, std::vector<double>(dtable.size(), 5.0));
  EXPECT_EQ(dx, std::vector<double>(dx.size(), 6.0));

  // A negative offset (allowed without ids) places tokens before row 0: refused the same way, in
  // float64 and float32 (the fast path), forward and backward.
  s = c.run({{}, -1}, y);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(s.arg(), "positions");
  EXPECT_EQ(y, std::vector<double>(y.size(), -3.0));
  std::vector<float> xf = to_float(c.x), tf = to_float(c.table), yf(xf.size(), -3.f), dtf(tf.size(), 5.f);
  EXPECT_EQ(learned_forward({}, V(xf, {2, 3, 4}), V(tf, {10, 4}), {{}, -2}, V(yf, {2, 3, 4})).arg(), "positions");
  EXPECT_EQ(yf, std::vector<float>(yf.size(), -3.f));
  EXPECT_EQ(learned_backward({}, V(xf, {2, 3, 4}), V(tf, {10, 4}), {{}, -1}, View{}, V(dtf, {10, 4})).arg(),
            "positions");
  EXPECT_EQ(dtf, std::vector<float>(dtf.size(), 5.f));
}

TEST(Learned, BackwardScatterAddsRepeatedPositionsByFiniteDifferences) {
  LearnedCase c;
  std::vector<std::int64_t> ids = {1, 1, 3, 3, 1, 0};  // repeats within and across the batch
  const Positions pos{View::contiguous(ids.data(), DType::kI64, {2, 3}), 0};
  const std::vector<double> proj = randn(c.x.size(), 13);
  auto loss_table = [&](const std::vector<double>& table) {
    std::vector<double> t = table, y(c.x.size());
    EXPECT_TRUE(learned_forward({}, V(c.x, {2, 3, 4}), V(t, {10, 4}), pos, V(y, {2, 3, 4})).ok());
    return dot(proj, y);
  };
  auto loss_x = [&](const std::vector<double>& x) {
    std::vector<double> xx = x, y(c.x.size());
    EXPECT_TRUE(learned_forward({}, V(xx, {2, 3, 4}), V(c.table, {10, 4}), pos, V(y, {2, 3, 4})).ok());
    return dot(proj, y);
  };
  std::vector<double> dy = proj, dx(c.x.size(), 9.0), dtable(c.table.size(), 9.0);  // overwritten
  ASSERT_TRUE(learned_backward({}, V(dy, {2, 3, 4}), V(c.table, {10, 4}), pos, V(dx, {2, 3, 4}),
                               V(dtable, {10, 4}))
                  .ok());
  EXPECT_TRUE(GradCheck(loss_table, c.table, dtable));
  EXPECT_TRUE(GradCheck(loss_x, c.x, dx));

  // Either output may be absent.
  std::vector<double> dtable2(c.table.size());
  ASSERT_TRUE(learned_backward({}, V(dy, {2, 3, 4}), V(c.table, {10, 4}), pos, View{}, V(dtable2, {10, 4})).ok());
  EXPECT_EQ(dtable2, dtable);
}

TEST(Learned, BadInputsNameTheArgument) {
  LearnedCase c;
  std::vector<double> y(c.x.size()), t6(10 * 6);
  std::vector<float> yf(c.x.size()), dtf(10 * 4);
  const View x = V(c.x, {2, 3, 4}), tab = V(c.table, {10, 4});
  EXPECT_EQ(learned_forward({}, x, V(t6, {10, 6}), {}, V(y, {2, 3, 4})).arg(), "table");
  EXPECT_EQ(learned_forward({}, x, View{}, {}, V(y, {2, 3, 4})).arg(), "table");
  EXPECT_EQ(learned_forward({}, x, tab, {}, V(yf, {2, 3, 4})).arg(), "y");
  EXPECT_EQ(learned_forward({}, x, tab, {}, V(y, {3, 2, 4})).arg(), "y");
  EXPECT_EQ(learned_forward({}, V(c.x, {6, 4}), tab, {}, V(y, {6, 4})).arg(), "x");
  std::vector<std::int64_t> ids = {0, 1};
  EXPECT_EQ(learned_forward({}, x, tab, {View::contiguous(ids.data(), DType::kI64, {2}), 0}, V(y, {2, 3, 4})).arg(),
            "positions");
  EXPECT_EQ(learned_backward({}, x, tab, {}, V(yf, {2, 3, 4}), View{}).arg(), "dx");
  EXPECT_EQ(learned_backward({}, x, tab, {}, View{}, V(dtf, {10, 4})).arg(), "dtable");
  EXPECT_EQ(learned_backward({}, x, tab, {}, View{}, V(y, {6, 4})).arg(), "dtable");
}

}  // namespace
}  // namespace posenc
