// The attention tiles' small GEMM (src/attention/tile_gemm.cc) against a plain triple loop in double,
// on every SIMD target compiled and supported here: the four forms (NT and NP overwriting C, NN
// and TN adding to it; NP also against NT bit for bit), M, N, K ∈ {1, 3, 16, 17, 33, 64} (tails shorter than a vector, one and two vectors
// and more on every width), leading dimensions equal to and larger than the rows, alpha ≠ 1, the
// tiles' largest sizes (128), products taller than a tile (the model's projections, blocks of 8
// rows), a K past the NT stack buffer, empty products, and banded (causal) tiles. Bounds: each element
// within (2K + 3)·2⁻²⁴·(|alpha|·Σ_k |a·b| + |C₀|) of the exact value (K multiply-adds, each at most
// two roundings where the target has no FMA, then alpha and the add). Elements of C outside M × N
// (the ld gaps and past the end) keep their guard values. A row computed alone equals the same row
// computed inside a larger product, bit for bit (the models' bit-reproducibility rests on it).
// Never times anything.
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention/tile_gemm.h"
#include "testing.h"

namespace posenc {
namespace {

using attn_fast::GemmForm;
using I = std::int64_t;
using testing::randn;

constexpr float kGuard = -777.25f;
inline std::size_t sz(I n) { return static_cast<std::size_t>(n); }

const char* name(GemmForm f) {
  return f == GemmForm::kNT ? "NT" : f == GemmForm::kNN ? "NN" : f == GemmForm::kTN ? "TN" : "NP";
}
// kNT and kNP write C (beta = 0); kNN and kTN add to it.
bool writes(GemmForm f) { return f == GemmForm::kNT || f == GemmForm::kNP; }

// One case: A, B, C₀ in memory with the given leading dimensions; the exact result and its bound.
struct Case {
  GemmForm form;
  I M, N, K, lda, ldb, ldc;
  float alpha;
  std::vector<float> A, B, C0;
  std::vector<double> want, bound;  // [M, N]

  Case(GemmForm f, I m, I n, I k, I pad, float al, std::uint64_t seed)
      : form(f), M(m), N(n), K(k), alpha(al) {
    const I arows = f == GemmForm::kTN ? K : M, acols = f == GemmForm::kTN ? M : K;
    const I brows = f == GemmForm::kNT ? N : K, bcols = f == GemmForm::kNT ? K : N;
    lda = acols + pad;
    ldb = bcols + 2 * pad;
    ldc = N + pad;
    A = fill(arows, acols, lda, seed + 1);
    B = fill(brows, bcols, ldb, seed + 2);
    C0.assign(sz(M * ldc + 7), kGuard);
    const std::vector<double> c = randn(sz(M * N), seed + 3);
    if (!writes(f))  // NT and NP write C without reading it: their C₀ stays the guard value
      for (I i = 0; i < M; ++i)
        for (I j = 0; j < N; ++j) C0[sz(i * ldc + j)] = float(c[sz(i * N + j)]);
    want.assign(sz(M * N), 0.0);
    bound.assign(sz(M * N), 0.0);
    for (I i = 0; i < M; ++i)
      for (I j = 0; j < N; ++j) {
        double s = 0, sa = 0;
        for (I kk = 0; kk < K; ++kk) {
          const double p = double(a(i, kk)) * double(b(kk, j));
          s += p;
          sa += std::fabs(p);
        }
        const double c0 = writes(f) ? 0.0 : double(C0[sz(i * ldc + j)]);
        want[sz(i * N + j)] = c0 + double(alpha) * s;
        bound[sz(i * N + j)] = double(2 * K + 3) * 0x1p-24 * (std::fabs(double(alpha)) * sa + std::fabs(c0));
      }
  }
  static std::vector<float> fill(I rows, I cols, I ld, std::uint64_t seed) {
    std::vector<float> x(sz(rows * ld + 5), kGuard);
    const std::vector<double> r = randn(sz(rows * cols), seed);
    for (I i = 0; i < rows; ++i)
      for (I j = 0; j < cols; ++j) x[sz(i * ld + j)] = float(r[sz(i * cols + j)]);
    return x;
  }
  float a(I i, I k) const { return form == GemmForm::kTN ? A[sz(k * lda + i)] : A[sz(i * lda + k)]; }
  float b(I k, I j) const { return form == GemmForm::kNT ? B[sz(j * ldb + k)] : B[sz(k * ldb + j)]; }

  std::vector<float> run(attn_fast::TileGemmFn g, I band = attn_fast::kNoBand) const {
    std::vector<float> C = C0;
    g(form, M, N, K, alpha, A.data(), lda, B.data(), ldb, C.data(), ldc, band);
    return C;
  }

  // Every element within its bound, every other element of C untouched.
  ::testing::AssertionResult check(const std::vector<float>& C) const {
    for (std::size_t t = 0; t < C.size(); ++t) {
      const I i = I(t) / ldc, j = I(t) % ldc;
      if (i < M && j < N) {
        const double got = C[t], w = want[sz(i * N + j)], tol = bound[sz(i * N + j)];
        if (!(std::fabs(got - w) <= tol))
          return ::testing::AssertionFailure() << "C[" << i << ", " << j << "] = " << got << ", want " << w
                                               << " ± " << tol;
      } else if (C[t] != C0[t]) {
        return ::testing::AssertionFailure() << "wrote outside the product at " << t;
      }
    }
    return ::testing::AssertionSuccess();
  }
};

// Every target, each with both register blockings (tile_gemm.h's TileBlocks).
template <class F>
void ForEachTarget(F&& body) {
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    for (attn_fast::TileBlocks bl : {attn_fast::TileBlocks::kNarrow, attn_fast::TileBlocks::kWide})
      body(attn_fast::tile_gemm_fn(bl),
           std::string(hwy::TargetName(t)) + (bl == attn_fast::TileBlocks::kWide ? " wide" : " narrow"));
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(TileGemm, EveryFormAndSizeMatchesDoubleOnEveryTarget) {
  std::vector<Case> cases;
  std::uint64_t seed = 10;
  const I sizes[] = {1, 3, 16, 17, 33, 64};
  for (GemmForm f : {GemmForm::kNT, GemmForm::kNN, GemmForm::kTN, GemmForm::kNP})
    for (I m : sizes)
      for (I n : sizes)
        for (I k : sizes) {
          seed += 5;
          const I pad = (m + n + k) % 2 == 0 ? 0 : 3;  // half the cases with ld > the row
          const float alpha = seed % 3 == 0 ? 1.f : seed % 3 == 1 ? 0.25f : -1.375f;
          cases.emplace_back(f, m, n, k, pad, alpha, seed);
        }
  int n = 0;
  ForEachTarget([&](attn_fast::TileGemmFn g, const std::string& target) {
    for (const Case& c : cases) {
      SCOPED_TRACE(target + " " + name(c.form) + " M " + std::to_string(c.M) + " N " + std::to_string(c.N) +
                   " K " + std::to_string(c.K) + " lda " + std::to_string(c.lda));
      ASSERT_TRUE(c.check(c.run(g)));
      ++n;
    }
  });
  EXPECT_GT(n, 0);
}

// The tiles' largest products (128 = kBq = kBk), K past NT's stack buffer (its heap path), and
// shapes of the attention (score tiles with ld 128, D = 16, 20, 32).
TEST(TileGemm, LargeAndAttentionShapesOnEveryTarget) {
  std::vector<Case> cases;
  std::uint64_t seed = 5000;
  for (GemmForm f : {GemmForm::kNT, GemmForm::kNN, GemmForm::kTN, GemmForm::kNP}) {
    cases.emplace_back(f, 128, 128, 128, 1, 0.5f, seed += 5);
    cases.emplace_back(f, 40, 50, 200, 2, 1.f, seed += 5);
    cases.emplace_back(f, 127, 129, 31, 0, -2.f, seed += 5);
    cases.emplace_back(f, 301, 70, 64, 1, 1.f, seed += 5);  // taller than a tile: blocks of 8 rows
    cases.emplace_back(f, 64, 192, 1024, 0, 1.f, seed += 5);  // a projection's weight gradient
  }
  for (I D : {16, 20, 32}) {
    cases.emplace_back(GemmForm::kNT, 64, 64, D, 128 - 64, 0.25f, seed += 5);  // S = scale·Q·Kᵀ
    cases.emplace_back(GemmForm::kNN, 64, D, 64, 3, 1.f, seed += 5);         // O += P·V
    cases.emplace_back(GemmForm::kTN, 64, D, 64, 5, 0.25f, seed += 5);       // dV, dK += Pᵀ·dO, dSᵀ·Q
  }
  ForEachTarget([&](attn_fast::TileGemmFn g, const std::string& target) {
    for (const Case& c : cases) {
      SCOPED_TRACE(target + " " + name(c.form) + " M " + std::to_string(c.M) + " N " + std::to_string(c.N) +
                   " K " + std::to_string(c.K));
      ASSERT_TRUE(c.check(c.run(g)));
    }
  });
}

// M = 0, N = 0 write nothing; K = 0 gives NT's C = 0 and leaves NN's and TN's C as they were.
TEST(TileGemm, EmptyProductsOnEveryTarget) {
  ForEachTarget([&](attn_fast::TileGemmFn g, const std::string& target) {
    SCOPED_TRACE(target);
    for (GemmForm f : {GemmForm::kNT, GemmForm::kNN, GemmForm::kTN, GemmForm::kNP}) {
      for (auto [m, n, k] : {std::tuple<I, I, I>{0, 5, 3}, {5, 0, 3}, {5, 7, 0}, {0, 0, 0}}) {
        const Case c(f, m, n, k, 2, 1.5f, 77);
        ASSERT_TRUE(c.check(c.run(g))) << name(f) << " " << m << " " << n << " " << k;
      }
    }
  });
}

// Each row of C alone (M = 1 at that row's A, C) equals the row inside the full product, bit for
// bit, and so does each column block (N a part of the columns): no result depends on where it lies.
TEST(TileGemm, RowsAndColumnsDoNotDependOnTheirBlockOnEveryTarget) {
  ForEachTarget([&](attn_fast::TileGemmFn g, const std::string& target) {
    for (GemmForm f : {GemmForm::kNT, GemmForm::kNN, GemmForm::kTN, GemmForm::kNP}) {
      SCOPED_TRACE(target + " " + name(f));
      // 203: past kWideM, blocks of 8 rows on AVX-512; N = 70: a block of 4 vectors (wide) and a tail
      for (const auto& [m, n] : {std::pair<I, I>{37, 45}, {203, 45}, {37, 70}}) {
        const Case c(f, m, n, 19, 3, 0.75f, 901);
        const std::vector<float> full = c.run(g);
        for (I i = 0; i < c.M; ++i) {
          std::vector<float> C = c.C0;
          const float* a = f == GemmForm::kTN ? c.A.data() + i : c.A.data() + i * c.lda;
          g(f, 1, c.N, c.K, c.alpha, a, c.lda, c.B.data(), c.ldb, C.data() + i * c.ldc, c.ldc, attn_fast::kNoBand);
          for (I j = 0; j < c.N; ++j) ASSERT_EQ(C[sz(i * c.ldc + j)], full[sz(i * c.ldc + j)]) << i << " " << j;
        }
        for (I j0 : {I{0}, I{5}, I{21}}) {  // columns [j0, N) alone
          std::vector<float> C = c.C0;
          const float* b = f == GemmForm::kNT ? c.B.data() + j0 * c.ldb : c.B.data() + j0;
          g(f, c.M, c.N - j0, c.K, c.alpha, c.A.data(), c.lda, b, c.ldb, C.data() + j0, c.ldc, attn_fast::kNoBand);
          for (I i = 0; i < c.M; ++i)
            for (I j = j0; j < c.N; ++j) ASSERT_EQ(C[sz(i * c.ldc + j)], full[sz(i * c.ldc + j)]) << i << " " << j;
        }
      }
    }
  });
}

// A band c (causal tiles, tile_gemm.h): the score tile's entries (query i, key j) with j > i + c are
// masked. kNT and kNP: every entry with j ≤ i + c equals the full product's, bit for bit, and nothing outside
// M × N is written; kNN and kTN, whose masked A entries hold zeros (as P and dS do): all of C equals
// the full product's. Bands below, on, above the diagonal and past the tile; sizes that straddle the
// row blocks and vector widths.
TEST(TileGemm, BandedProductsEqualTheFullOnesWhereTheyMatterOnEveryTarget) {
  std::vector<std::tuple<Case, I>> cases;
  std::uint64_t seed = 7000;
  for (GemmForm f : {GemmForm::kNT, GemmForm::kNN, GemmForm::kTN, GemmForm::kNP})
    for (auto [m, n, k] : {std::tuple<I, I, I>{64, 64, 16}, {37, 45, 19}, {128, 128, 64}, {5, 70, 3},
                           {70, 5, 9}, {1, 1, 1}})
      for (I c : {I{-100}, I{-30}, I{-3}, I{0}, I{1}, I{7}, I{40}, I{200}}) {
        Case cs(f, m, n, k, 2, 0.75f, seed += 3);
        // kNN's and kTN's A is the tile (A [M, K] and A [K, M]; kNT's is its C)
        const I rows = f == GemmForm::kTN ? k : m, cols = f == GemmForm::kTN ? m : k;
        if (!writes(f))  // zeros in the masked entries of A
          for (I i = 0; i < rows; ++i)
            for (I j = 0; j < cols; ++j) {
              const bool masked = j > i + c;  // row = query, column = key in both
              if (masked) cs.A[sz(i * cs.lda + j)] = 0.f;
            }
        cases.emplace_back(std::move(cs), c);
      }
  ForEachTarget([&](attn_fast::TileGemmFn g, const std::string& target) {
    for (const auto& [cs, c] : cases) {
      SCOPED_TRACE(target + " " + name(cs.form) + " M " + std::to_string(cs.M) + " N " + std::to_string(cs.N) +
                   " K " + std::to_string(cs.K) + " band " + std::to_string(c));
      const std::vector<float> full = cs.run(g), banded = cs.run(g, c);
      for (std::size_t t = 0; t < full.size(); ++t) {
        const I i = I(t) / cs.ldc, j = I(t) % cs.ldc;
        const bool inside = i < cs.M && j < cs.N;
        if (!inside) {
          ASSERT_EQ(banded[t], cs.C0[t]) << "wrote outside the product at " << t;
        } else if (!writes(cs.form) || j <= i + c) {
          ASSERT_EQ(banded[t], full[t]) << i << " " << j;
        }
      }
    }
  });
}

// kNP given Bᵀ equals kNT given B, bit for bit (the same sums), with and without a band; what
// kNT leaves unwritten under a band, kNP leaves too.
TEST(TileGemm, PackedFormEqualsNTBitForBitOnEveryTarget) {
  std::vector<Case> cases;
  std::uint64_t seed = 9000;
  for (auto [m, n, k] : {std::tuple<I, I, I>{128, 128, 64}, {37, 45, 19}, {5, 70, 3}, {70, 131, 33}})
    cases.emplace_back(GemmForm::kNT, m, n, k, 3, 0.625f, seed += 3);
  ForEachTarget([&](attn_fast::TileGemmFn g, const std::string& target) {
    for (const Case& c : cases) {
      const I ldt = c.N + 5;  // Bᵀ [K, N]
      std::vector<float> bt(sz(c.K * ldt), kGuard);
      for (I kk = 0; kk < c.K; ++kk)
        for (I j = 0; j < c.N; ++j) bt[sz(kk * ldt + j)] = c.B[sz(j * c.ldb + kk)];
      for (I band : {attn_fast::kNoBand, I{-3}, I{0}, I{20}}) {
        SCOPED_TRACE(target + " M " + std::to_string(c.M) + " N " + std::to_string(c.N) + " band " +
                     std::to_string(band));
        std::vector<float> nt = c.C0, np = c.C0;
        g(GemmForm::kNT, c.M, c.N, c.K, c.alpha, c.A.data(), c.lda, c.B.data(), c.ldb, nt.data(), c.ldc, band);
        g(GemmForm::kNP, c.M, c.N, c.K, c.alpha, c.A.data(), c.lda, bt.data(), ldt, np.data(), c.ldc, band);
        for (std::size_t t = 0; t < nt.size(); ++t) ASSERT_EQ(np[t], nt[t]) << t;
      }
    }
  });
}

// The wide blocks give the narrow blocks' results bit for bit (the same sum for every element), on
// the attention's tile shapes and on shapes with tails (M = 8, 128 and 134 ≡ 2 mod 6: their last 8
// rows as two 4-row blocks), with and without a band (kNN's and kTN's masked A entries zero, as
// the band requires; kNT's and kNP's masked C entries not compared).
TEST(TileGemm, WideBlocksEqualNarrowBitForBitOnEveryTarget) {
  std::vector<std::tuple<Case, I>> cases;
  std::uint64_t seed = 9500;
  for (GemmForm f : {GemmForm::kNT, GemmForm::kNN, GemmForm::kTN, GemmForm::kNP})
    for (auto [m, n, k] : {std::tuple<I, I, I>{128, 64, 128}, {128, 128, 64}, {131, 70, 33}, {7, 200, 5},
                           {8, 64, 16}, {134, 64, 40}})
      for (I band : {attn_fast::kNoBand, I{-3}, I{0}}) {
        Case cs(f, m, n, k, 2, 0.625f, seed += 3);
        const I rows = f == GemmForm::kTN ? k : m, cols = f == GemmForm::kTN ? m : k;
        if (!writes(f) && band != attn_fast::kNoBand)
          for (I i = 0; i < rows; ++i)
            for (I j = 0; j < cols; ++j)
              if (j > i + band) cs.A[sz(i * cs.lda + j)] = 0.f;
        cases.emplace_back(std::move(cs), band);
      }
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    const attn_fast::TileGemmFn narrow = attn_fast::tile_gemm_fn(attn_fast::TileBlocks::kNarrow);
    const attn_fast::TileGemmFn wide = attn_fast::tile_gemm_fn(attn_fast::TileBlocks::kWide);
    for (const auto& [c, band] : cases) {
      SCOPED_TRACE(std::string(hwy::TargetName(t)) + " " + name(c.form) + " M " + std::to_string(c.M) +
                   " N " + std::to_string(c.N) + " band " + std::to_string(band));
      const std::vector<float> a = c.run(narrow, band), b = c.run(wide, band);
      for (std::size_t e = 0; e < a.size(); ++e) {
        const I i = I(e) / c.ldc, j = I(e) % c.ldc;
        // kNT and kNP may leave masked entries unwritten, which ones depending on the blocks
        if (writes(c.form) && band != attn_fast::kNoBand && i < c.M && j < c.N && j > i + band) continue;
        ASSERT_EQ(b[e], a[e]) << i << " " << j;
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The default blocks follow their rule (tile_gemm.h), read here from /proc/cpuinfo rather than
// CPUID: wide on Intel and on AMD family 25 (Zen 4) or later, narrow elsewhere.
TEST(TileGemm, DefaultBlocksFollowTheVendorAndFamily) {
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line, vendor;
  int family = -1;
  while (std::getline(in, line) && (vendor.empty() || family < 0)) {
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (line.rfind("vendor_id", 0) == 0) vendor = line.substr(colon + 2);
    if (line.rfind("cpu family", 0) == 0) family = std::stoi(line.substr(colon + 1));
  }
  if (vendor.empty() || family < 0) GTEST_SKIP() << "/proc/cpuinfo names no x86 vendor and family";
  const bool wide = vendor == "GenuineIntel" || (vendor == "AuthenticAMD" && family >= 25);
  EXPECT_EQ(attn_fast::default_tile_blocks(), wide ? attn_fast::TileBlocks::kWide : attn_fast::TileBlocks::kNarrow)
      << vendor << " family " << family;
}

// The transpose equals the plain one, element for element, on every target: sizes with and without
// 4 × 4 blocks and edges, row strides past the rows; bt's entries outside [K, n] keep their guards.
TEST(TileGemm, TransposeEqualsThePlainOneOnEveryTarget) {
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    const attn_fast::TileTransposeFn tr = attn_fast::tile_transpose_fn();
    for (auto [n, k] : {std::tuple<I, I>{128, 128}, {128, 64}, {1, 1}, {3, 5}, {17, 33}, {64, 7}, {0, 4}}) {
      SCOPED_TRACE(std::string(hwy::TargetName(t)) + " n " + std::to_string(n) + " K " + std::to_string(k));
      const I ldb = k + 3, ldt = n + 6;
      const std::vector<double> r = randn(sz(n * ldb), std::uint64_t(n * 1000 + k));
      const std::vector<float> B(r.begin(), r.end());
      std::vector<float> bt(sz(k * ldt + 5), kGuard);
      tr(B.data(), ldb, n, k, bt.data(), ldt);
      for (I kk = 0; kk < k; ++kk)
        for (I j = 0; j < ldt; ++j)
          ASSERT_EQ(bt[sz(kk * ldt + j)], j < n ? B[sz(j * ldb + kk)] : kGuard) << kk << " " << j;
      for (I e = k * ldt; e < k * ldt + 5; ++e) ASSERT_EQ(bt[sz(e)], kGuard);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace posenc
