// The bfloat16-pair kernels (src/attention/tile_gemm_bf16.cc) against plain loops: in the emulated
// mode (any AVX-512 CPU), with VDPBF16PS where this CPU has AVX512_BF16 and with AMX where it has
// AMX-BF16 (else that mode is skipped, saying so). The packings bit for bit (rounding to nearest
// even, ties, NaN, ±inf, denormals as signed zeros, odd lengths, row tails past 16, padding as 0); the products within (2P + 2)·2⁻²⁴·Σ|a·b| (+ |C₀| for
// the accumulating form) of the exact sum of the bfloat16 products, in double, for M, N, P from 1 to
// past a register block, leading dimensions above the rows, bands (causal tiles: the entries that
// matter exact, masked pairs of A skipped), and C outside the written entries untouched. Never
// times anything.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attention/tile_gemm.h"
#include "attention/tile_gemm_bf16.h"
#include "posenc/half.h"
#include "testing.h"

namespace posenc {
namespace {

using attn_fast::Bf16Form;
using attn_fast::Bf16Mode;
using attn_fast::Pair;
using I = std::int64_t;
using testing::randn;

constexpr float kGuard = -777.25f;
std::size_t sz(I n) { return static_cast<std::size_t>(n); }

float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t bf(float f) { return to_bf16(f).bits; }
std::vector<float> randf(std::size_t n, std::uint64_t seed) {
  const std::vector<double> d = randn(n, seed);
  return std::vector<float>(d.begin(), d.end());
}
double widen(std::uint16_t h) { return bits_float(std::uint32_t{h} << 16); }

class Bf16Kernels : public ::testing::TestWithParam<Bf16Mode> {
 protected:
  void SetUp() override {
    attn_fast::bf16_set_mode(GetParam());
    ops_ = attn_fast::bf16_ops();
    if (!ops_) GTEST_SKIP() << "this CPU lacks the instructions of this mode";
  }
  void TearDown() override { attn_fast::bf16_set_mode(Bf16Mode::kAuto); }
  const attn_fast::Bf16Ops* ops_ = nullptr;
};

TEST_P(Bf16Kernels, RoundRowsRoundsToNearestEven) {
  // ties both ways, the largest finite rounding up to inf, NaN, ±inf, ±0, a denormal
  const float special[] = {bits_float(0x3f808000u), bits_float(0x3f818000u), bits_float(0x3f808001u),
                           bits_float(0x7f7fffffu), std::nanf(""), INFINITY, -INFINITY, 0.f, -0.f,
                           bits_float(0x00012345u), -1.5f, 3.f};
  for (I K : {I{1}, I{2}, I{7}, I{16}, I{31}, I{33}, I{64}}) {
    const I n = 3, ld = K + 5, ldo = (K + 1) / 2 + 2;
    std::vector<float> x = randf(sz(n * ld), 7 + K);
    for (std::size_t e = 0; e < std::size(special) && static_cast<I>(e) < K; ++e) x[e] = special[e];
    std::vector<Pair> out(sz(n * ldo), 0xdeadbeefu);
    ops_->round_rows(x.data(), ld, n, K, out.data(), ldo);
    for (I r = 0; r < n; ++r) {
      for (I e = 0; e < (K + 1) / 2 * 2; ++e) {
        const std::uint32_t pr = out[sz(r * ldo + e / 2)];
        const std::uint16_t got = e % 2 ? pr >> 16 : pr & 0xffff;
        const float v = x[sz(r * ld + e)];
        if (e >= K) {
          EXPECT_EQ(got, 0) << "pad, K " << K;
        } else if (std::isnan(v)) {
          EXPECT_TRUE(std::isnan(widen(got))) << "K " << K;
        } else if (std::fpclassify(v) == FP_SUBNORMAL) {  // read as a zero of its sign
          EXPECT_EQ(got, std::signbit(v) ? 0x8000 : 0) << "denormal, K " << K;
        } else {
          EXPECT_EQ(got, bf(v)) << "row " << r << " e " << e << " K " << K;
        }
      }
      for (I p = (K + 1) / 2; p < ldo; ++p) EXPECT_EQ(out[sz(r * ldo + p)], 0xdeadbeefu) << "past the row";
    }
  }
}

TEST_P(Bf16Kernels, TransposePairsIsATransposeOfDwords) {
  for (I n : {I{1}, I{15}, I{16}, I{17}, I{128}})
    for (I P : {I{1}, I{8}, I{16}, I{32}, I{40}}) {
      const I ld = 2 * P + 3, ldo = (n + 15) / 16 * 16 + 16;
      std::vector<std::uint16_t> x(sz(n * ld));
      for (std::size_t e = 0; e < x.size(); ++e) x[e] = static_cast<std::uint16_t>(e * 2654435761u >> 7);
      std::vector<Pair> out(sz((P + 1) * ldo), 0xdeadbeefu);
      ops_->transpose_pairs(x.data(), ld, n, P, out.data(), ldo);
      for (I p = 0; p <= P; ++p)
        for (I j = 0; j < ldo; ++j) {
          const Pair got = out[sz(p * ldo + j)];
          if (p == P || j >= (n + 15) / 16 * 16) {
            EXPECT_EQ(got, 0xdeadbeefu) << "written past the panel: p " << p << " j " << j;
          } else if (j >= n) {
            EXPECT_EQ(got, 0u) << "padding row " << j;
          } else {
            const Pair want = x[sz(j * ld + 2 * p)] | std::uint32_t{x[sz(j * ld + 2 * p + 1)]} << 16;
            ASSERT_EQ(got, want) << "n " << n << " P " << P << " p " << p << " j " << j;
          }
        }
    }
}

TEST_P(Bf16Kernels, InterleaveRowsPairsConsecutiveRows) {
  for (I n : {I{1}, I{2}, I{7}, I{128}})
    for (I K : {I{1}, I{6}, I{16}, I{50}, I{64}}) {
      const I ld = K + 9, ldo = K + 4, np = (n + 1) / 2;
      std::vector<std::uint16_t> x(sz(n * ld));
      for (std::size_t e = 0; e < x.size(); ++e) x[e] = static_cast<std::uint16_t>(e * 40503u + 17);
      std::vector<Pair> out(sz((np + 1) * ldo), 0xdeadbeefu);
      ops_->interleave_rows(x.data(), ld, n, K, out.data(), ldo);
      for (I p = 0; p <= np; ++p)
        for (I e = 0; e < ldo; ++e) {
          const Pair got = out[sz(p * ldo + e)];
          if (p == np || e >= K) {
            EXPECT_EQ(got, 0xdeadbeefu) << "written outside: p " << p << " e " << e;
            continue;
          }
          const std::uint32_t lo = x[sz(2 * p * ld + e)];
          const std::uint32_t hi = 2 * p + 1 < n ? x[sz((2 * p + 1) * ld + e)] : 0;
          ASSERT_EQ(got, lo | hi << 16) << "n " << n << " K " << K << " p " << p << " e " << e;
        }
    }
}

// A [M, P] and B [P, N] as pairs of random bfloat16; C against the exact sums.
void check_gemm(const attn_fast::Bf16Ops& ops, Bf16Form form, I M, I N, I P, I band, float alpha) {
  const I lda = P + 3, ldb = N + 5, ldc = N + 2;
  const std::vector<float> fa = randf(sz(2 * M * lda), 11 + M), fb = randf(sz(2 * P * ldb), 13 + N),
                           fc = randf(sz(M * ldc), 17 + P);
  std::vector<Pair> A(sz(M * lda)), B(sz(P * ldb));
  for (I i = 0; i < M; ++i)
    for (I p = 0; p < lda; ++p) {
      // the masked pairs of A (keys past i + band) hold zeros, as a softmax's P does
      const bool lo_masked = form == Bf16Form::kValues && 2 * p > i + band;
      const bool hi_masked = form == Bf16Form::kValues && 2 * p + 1 > i + band;
      const std::uint32_t lo = lo_masked ? 0 : bf(fa[sz(2 * (i * lda + p))]);
      const std::uint32_t hi = hi_masked ? 0 : bf(fa[sz(2 * (i * lda + p) + 1)]);
      A[sz(i * lda + p)] = lo | hi << 16;
    }
  for (std::size_t e = 0; e < B.size(); ++e) B[e] = bf(fb[2 * e]) | std::uint32_t{bf(fb[2 * e + 1])} << 16;
  std::vector<float> C(sz(M * ldc));
  for (std::size_t e = 0; e < C.size(); ++e) C[e] = form == Bf16Form::kValues ? fc[e] : kGuard;
  const std::vector<float> C0 = C;
  ops.gemm(form, M, N, P, alpha, A.data(), lda, B.data(), ldb, C.data(), ldc, band);
  for (I i = 0; i < M; ++i)
    for (I j = 0; j < ldc; ++j) {
      const float got = C[sz(i * ldc + j)];
      const bool matters = j < N && (form == Bf16Form::kValues || j <= i + band);
      if (j >= N) {
        EXPECT_EQ(got, C0[sz(i * ldc + j)]) << "C written past N: i " << i << " j " << j;
        continue;
      }
      if (!matters) {  // a masked score: unwritten or any value
        continue;
      }
      double want = 0, mag = 0;
      for (I p = 0; p < P; ++p) {
        const Pair a = A[sz(i * lda + p)], b = B[sz(p * ldb + j)];
        const double t = widen(a & 0xffff) * widen(b & 0xffff) + widen(a >> 16) * widen(b >> 16);
        want += t;
        mag += std::fabs(widen(a & 0xffff) * widen(b & 0xffff)) + std::fabs(widen(a >> 16) * widen(b >> 16));
      }
      want *= alpha;
      double bound = (2.0 * P + 2) * std::ldexp(1.0, -24) * std::fabs(alpha) * mag;
      if (form == Bf16Form::kValues) {  // C₀ added at the end, or summed into (AMX)
        want += C0[sz(i * ldc + j)];
        bound += (2.0 * P + 3) * std::ldexp(1.0, -24) * (std::fabs(want) + std::fabs(C0[sz(i * ldc + j)]));
      }
      ASSERT_LE(std::fabs(got - want), bound + 1e-30)
          << (form == Bf16Form::kScores ? "scores" : "values") << " M " << M << " N " << N << " P " << P
          << " band " << band << " at (" << i << ", " << j << ")";
    }
}

TEST_P(Bf16Kernels, ProductsMatchExactSums) {
  for (Bf16Form form : {Bf16Form::kScores, Bf16Form::kValues})
    for (I M : {I{1}, I{5}, I{6}, I{13}, I{128}})
      for (I N : {I{1}, I{16}, I{17}, I{64}, I{100}, I{128}})
        for (I P : {I{1}, I{3}, I{32}, I{64}}) check_gemm(*ops_, form, M, N, P, attn_fast::kNoBand, 0.125f);
}

TEST_P(Bf16Kernels, BandedProductsMatchWhereTheyMatter) {
  for (Bf16Form form : {Bf16Form::kScores, Bf16Form::kValues})
    for (I band : {I{-20}, I{-3}, I{0}, I{5}, I{40}})
      // kValues: A's index runs over keys, so P pairs cover 2P keys
      check_gemm(*ops_, form, 37, form == Bf16Form::kScores ? 70 : 64, form == Bf16Form::kScores ? 32 : 35, band,
                 1.f);
}

std::string mode_name(const ::testing::TestParamInfo<Bf16Mode>& info) {
  return info.param == Bf16Mode::kAmx ? "Amx" : info.param == Bf16Mode::kVdpbf16 ? "Vdpbf16" : "Emulated";
}
INSTANTIATE_TEST_SUITE_P(Modes, Bf16Kernels,
                         ::testing::Values(Bf16Mode::kEmulated, Bf16Mode::kVdpbf16, Bf16Mode::kAmx), mode_name);

// kOff: none; kAuto: AMX where the CPU has it, and none where it has neither AMX nor AVX512_BF16.
TEST(Bf16Kernels, ModesPickTheirKernels) {
  attn_fast::bf16_set_mode(Bf16Mode::kOff);
  EXPECT_EQ(attn_fast::bf16_ops(), nullptr);
  attn_fast::bf16_set_mode(Bf16Mode::kAmx);
  const attn_fast::Bf16Ops* amx = attn_fast::bf16_ops();
  EXPECT_EQ(amx != nullptr, attn_fast::cpu_has_amx_bf16());
  attn_fast::bf16_set_mode(Bf16Mode::kAuto);
  if (amx) {
    EXPECT_EQ(attn_fast::bf16_ops(), amx);
  }
  if (!attn_fast::cpu_has_avx512_bf16()) {
    EXPECT_EQ(attn_fast::bf16_ops(), nullptr);
  }
}

}  // namespace
}  // namespace posenc
