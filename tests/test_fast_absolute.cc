// The absolute encodings' fast paths (sinusoidal, learned; forward and learned's dtable) against
// posenc::reference::, on every SIMD target here, for float32 / bfloat16 / float16 storage, odd
// sizes, strided views, guard bands, large positions, one and two threads, outputs large enough for
// the non-temporal stores, and 16-bit rounding. Tolerances scale with dtype. Never times anything.
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

}  // namespace
}  // namespace posenc
