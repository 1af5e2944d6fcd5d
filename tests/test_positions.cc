// The ranges every position-taking encoding accepts and what it does at their edges:
//   * positions (ids + offset, or offset + l) within |p| <= 2^53 (view.h), else Code::kOutOfRange
//     naming "positions", for rope, sinusoidal, rope2d, mrope and xpos, forward and backward, with
//     nothing written; positions up to 2^53 rotate exactly (against long double);
//   * frequencies whose angles would overflow are errors naming the field (theta, inv_freq,
//     freq_factors, factor, base, freqs); huge but finite angles (a tiny theta or base, a large
//     mixed frequency, a far position) are computed as the double reference computes them, the fast
//     path included (it hands such calls to the reference), against an independent computation;
//   * xPos's scale a·ρ must fit the output's dtype: an error naming "positions" with the limit
//     otherwise, float64 working where the value is finite in float64.
#include <cfloat>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "posenc/absolute.h"
#include "posenc/reference.h"
#include "posenc/rope.h"
#include "posenc/rotary.h"
#include "testing.h"

namespace posenc {
namespace {

using testing::AllClose;
using testing::V;
using testing::randn;
using testing::to_float;

using I = std::int64_t;
using Vec = std::vector<double>;
using Sz = std::size_t;

constexpr I kTwo53 = I{1} << 53;

// ---- positions -----------------------------------------------------------------------------------

// Every forward and backward of the position-taking encodings, on [1, 2, 1, 8] float32 inputs (the
// fast path; sinusoidal on [1, 2, 8]), with the given positions: the Status of each, and whether
// the output kept its fill.
struct Outcome {
  const char* what;
  Status s;
  bool untouched;
};

std::vector<Outcome> every_encoding(const Positions& pos1, const Positions& pos2, const Positions& pos3) {
  const I L = 2, D = 8;
  std::vector<float> x = to_float(randn(static_cast<Sz>(L * D), 1));
  std::vector<Outcome> out;
  auto run = [&](const char* what, auto&& fn) {
    std::vector<float> y(x.size(), 7.0f);
    const Status s = fn(V(x, {1, L, 1, D}), V(y, {1, L, 1, D}));
    out.push_back({what, s, y == std::vector<float>(y.size(), 7.0f)});
  };
  auto run3 = [&](const char* what, auto&& fn) {
    std::vector<float> y(x.size(), 7.0f);
    const Status s = fn(V(x, {1, L, D}), V(y, {1, L, D}));
    out.push_back({what, s, y == std::vector<float>(y.size(), 7.0f)});
  };
  run("rope forward", [&](View a, View b) { return rope_forward({}, a, pos1, b); });
  run("rope backward", [&](View a, View b) { return rope_backward({}, a, pos1, b); });
  run("rope q+k", [&](View a, View b) { return rope_apply_qk({}, a, View{}, pos1, b, View{}); });
  run("rope reference", [&](View a, View b) { return reference::rope_forward({}, a, pos1, b); });
  run3("sinusoidal forward", [&](View a, View b) { return sinusoidal_forward({}, a, pos1, b); });
  run3("sinusoidal backward", [&](View a, View b) { return sinusoidal_backward({}, a, pos1, b); });
  {
    std::vector<float> t(static_cast<Sz>(L * D), 7.0f);
    const Status s = sinusoidal_table({}, pos1, V(t, {L, D}));
    out.push_back({"sinusoidal table", s, t == std::vector<float>(t.size(), 7.0f)});
  }
  run("rope2d forward", [&](View a, View b) { return rope2d_forward({}, a, pos2, View{}, b); });
  run("rope2d backward", [&](View a, View b) { return rope2d_backward({}, a, pos2, View{}, b); });
  const MropeParams mp{.mrope_section = {2, 1, 1}};
  run("mrope forward", [&](View a, View b) { return mrope_forward(mp, a, pos3, b); });
  run("mrope backward", [&](View a, View b) { return mrope_backward(mp, a, pos3, b); });
  run("xpos forward", [&](View a, View b) { return xpos_forward({}, XposRole::kQuery, a, pos1, b); });
  run("xpos backward", [&](View a, View b) { return xpos_backward({}, XposRole::kKey, a, pos1, b); });
  return out;
}

void expect_all_out_of_range(const std::vector<Outcome>& got, const std::string& where) {
  for (const Outcome& o : got) {
    EXPECT_FALSE(o.s.ok()) << o.what << " accepted " << where;
    EXPECT_EQ(o.s.code(), Code::kOutOfRange) << o.what << ", " << where << ": " << o.s.message();
    EXPECT_EQ(o.s.arg(), "positions") << o.what << ", " << where << ": " << o.s.message();
    EXPECT_NE(o.s.what().find("2^53"), std::string::npos) << o.what << ": " << o.s.message();
    EXPECT_TRUE(o.untouched) << o.what << " wrote its output on an error (" << where << ")";
  }
}

TEST(Positions, OffsetsBeyond2To53AreErrorsForEveryEncoding) {
  // L = 2 tokens at offset and offset + 1; offset 2^53 puts the second at 2^53 + 1.
  for (I off : {I{1} << 60, std::numeric_limits<I>::max(), kTwo53, -kTwo53 - 1, std::numeric_limits<I>::min()}) {
    const Positions p{View{}, off};
    expect_all_out_of_range(every_encoding(p, p, p), "offset " + std::to_string(off));
  }
  // The bound is inclusive: offset 2^53 − 1 (second token at 2^53) and −2^53 are accepted (xPos's own
  // scale bound, which these far positions exceed, is tested below).
  for (I off : {kTwo53 - 1, -kTwo53}) {
    const Positions p{View{}, off};
    for (const Outcome& o : every_encoding(p, p, p)) {
      if (std::string(o.what).rfind("xpos", 0) == 0) continue;
      EXPECT_TRUE(o.s.ok()) << o.what << ": " << o.s.message();
    }
  }
}

TEST(Positions, IdsBeyond2To53AreErrorsForEveryEncoding) {
  for (I big : {I{1} << 57, I{1} << 60, std::numeric_limits<I>::max(), kTwo53 + 1}) {
    std::vector<I> p1 = {0, big}, p2 = {0, 1, big, 2}, p3 = {0, 1, 2, 3, 4, big};
    const Positions a{View::contiguous(p1.data(), DType::kI64, {2}), 0};
    const Positions b{View::contiguous(p2.data(), DType::kI64, {2, 2}), 0};
    const Positions c{View::contiguous(p3.data(), DType::kI64, {3, 2}), 0};
    expect_all_out_of_range(every_encoding(a, b, c), "id " + std::to_string(big));
  }
  // An id plus an offset that overflows int64, and one that passes 2^53 only with the offset.
  for (auto [id, off] : {std::pair{std::numeric_limits<I>::max(), I{5}}, std::pair{kTwo53, I{1}}}) {
    std::vector<I> p1 = {0, id}, p2 = {0, 1, id, 2}, p3 = {0, 1, 2, 3, 4, id};
    const Positions a{View::contiguous(p1.data(), DType::kI64, {2}), off};
    const Positions b{View::contiguous(p2.data(), DType::kI64, {2, 2}), off};
    const Positions c{View::contiguous(p3.data(), DType::kI64, {3, 2}), off};
    expect_all_out_of_range(every_encoding(a, b, c), "id + offset");
  }
  // Negative ids stay refused ("positions must be >= 0").
  std::vector<I> neg = {0, -1};
  Vec x(16), y(16);
  const Status s =
      rope_forward({}, V(x, {1, 2, 1, 8}), {View::contiguous(neg.data(), DType::kI64, {2}), 0}, V(y, {1, 2, 1, 8}));
  EXPECT_EQ(s.arg(), "positions");
  EXPECT_EQ(s.code(), Code::kOutOfRange);
}

}

}  // namespace
}  // namespace posenc
