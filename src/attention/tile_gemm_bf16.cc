// The bfloat16-pair kernels (tile_gemm_bf16.h): two copies of tile_gemm_bf16-inl.h, one with
// VDPBF16PS and one emulating it on AVX-512F; the AMX products; each function compiled for its
// target by attribute (so nothing else of the library needs AVX-512 or AMX); the CPUID checks.
#include "core/fast_common.h"
#include "attention/tile_gemm_bf16.h"

#include <hwy/base.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "attention/tile_gemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define POSENC_HAVE_BF16_KERNELS 1
#if !defined(__clang__)  // GCC 12's AVX-512 headers start masked intrinsics from an undefined vector
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <cpuid.h>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define POSENC_HAVE_BF16_KERNELS 0
#endif

namespace posenc::attn_fast {

// What rows [i0, i0 + rows) of a product need under a band (keys up to i0 + rows − 1 + band): of
// the scores, the columns *n (≤ N given); of the values, the pairs *p (≤ P given).
inline void BandExtent(Bf16Form form, std::int64_t i0, std::int64_t rows, std::int64_t band, std::int64_t* n,
                       std::int64_t* p) {
  if (band >= kNoBand) return;
  const std::int64_t keys = i0 + rows + band;
  if (form == Bf16Form::kScores) *n = std::clamp<std::int64_t>(keys, 0, *n);
  else *p = std::clamp<std::int64_t>((keys + 1) / 2, 0, *p);
}

#if POSENC_HAVE_BF16_KERNELS

#define POSENC_BF16_NS native
#define POSENC_BF16_NATIVE 1
#define POSENC_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16")))
#include "attention/tile_gemm_bf16-inl.h"
#undef POSENC_BF16_NS
#undef POSENC_BF16_NATIVE
#undef POSENC_BF16_TARGET

#define POSENC_BF16_NS emulated
#define POSENC_BF16_NATIVE 0
#define POSENC_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#include "attention/tile_gemm_bf16-inl.h"
#undef POSENC_BF16_NS
#undef POSENC_BF16_NATIVE
#undef POSENC_BF16_TARGET

// AMX (AMX-TILE, AMX-BF16): the products as 16 × 16 tiles of C, each a sum of TDPBF16PS over
// chunks of 16 pairs: 2 × 2 tiles at a time where a block is whole (Block2x2), else one tile at a
// time with tails (rows, columns, pairs under 16) as tiles configured that small (Tile1).
namespace amx {

using I = std::int64_t;

struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

#define POSENC_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16,amx-tile,amx-bf16")))

POSENC_AMX_TARGET inline void Configure(int mr, int nr, int kt) {
  TileConfig c;
  c.rows[0] = static_cast<std::uint8_t>(mr);
  c.colsb[0] = static_cast<std::uint16_t>(4 * nr);
  c.rows[1] = static_cast<std::uint8_t>(mr);
  c.colsb[1] = 64;
  c.rows[2] = 16;
  c.colsb[2] = static_cast<std::uint16_t>(4 * nr);
  if (kt > 0) {
    c.rows[3] = static_cast<std::uint8_t>(mr);
    c.colsb[3] = static_cast<std::uint16_t>(4 * kt);
    c.rows[4] = static_cast<std::uint8_t>(kt);
    c.colsb[4] = static_cast<std::uint16_t>(4 * nr);
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(c));
}

// Every tile 16 rows × 64 bytes: the 2 × 2 blocks' configuration.
POSENC_AMX_TARGET inline void ConfigureFull() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(c));
}

// C [32, 32] (+)= A [32, P]·B [P, 32], P a multiple of 16: four accumulating tiles (0 to 3), each
// chunk of A and B loaded once for two of them.
POSENC_AMX_TARGET inline void Block2x2(const Pair* A, I lda, const Pair* B, I ldb, I P, float* C, I ldc, bool acc) {
  const I sa = 4 * lda, sb = 4 * ldb, sc = 4 * ldc;
  if (acc) {
    _tile_loadd(0, C, sc);
    _tile_loadd(1, C + 16, sc);
    _tile_loadd(2, C + 16 * ldc, sc);
    _tile_loadd(3, C + 16 * ldc + 16, sc);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (I k = 0; k < P; k += 16) {
    _tile_loadd(4, A + k, sa);
    _tile_loadd(5, A + 16 * lda + k, sa);
    _tile_loadd(6, B + k * ldb, sb);
    _tile_loadd(7, B + k * ldb + 16, sb);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, C, sc);
  _tile_stored(1, C + 16, sc);
  _tile_stored(2, C + 16 * ldc, sc);
  _tile_stored(3, C + 16 * ldc + 16, sc);
}

// One C tile [mr, nr] at (i0, j0) over pairs [0, p), through buf: C (+)= alpha·(A·B).
POSENC_AMX_TARGET inline void Tile1(const Pair* A, I lda, const Pair* B, I ldb, I p, float alpha, bool acc, float* C,
                                    I ldc, int mr, int nr, int* current) {
  alignas(64) float buf[16 * 16];
  const int kt = static_cast<int>(p % 16);
  const int key = mr | nr << 5 | kt << 10;
  if (key != *current) {
    Configure(mr, nr, kt);
    *current = key;
  }
  _tile_zero(0);
  for (I k = 0; k + 16 <= p; k += 16) {
    _tile_loadd(1, A + k, 4 * lda);
    _tile_loadd(2, B + k * ldb, 4 * ldb);
    _tile_dpbf16ps(0, 1, 2);
  }
  if (kt > 0) {
    _tile_loadd(3, A + (p - kt), 4 * lda);
    _tile_loadd(4, B + (p - kt) * ldb, 4 * ldb);
    _tile_dpbf16ps(0, 3, 4);
  }
  _tile_stored(0, buf, 64);
  const __m512 al = _mm512_set1_ps(alpha);
  const __mmask16 m = native::Lanes(nr);
  for (int r = 0; r < mr; ++r) {
    float* y = C + r * ldc;
    __m512 x = _mm512_mul_ps(_mm512_load_ps(buf + 16 * r), al);
    if (acc) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, y));
    _mm512_mask_storeu_ps(y, m, x);
  }
}

// Blocks of 32 rows: 2 × 2 tiles where the block is whole (32 × 32, pairs a multiple of 16, alpha 1
// when adding), else single tiles. Beyond a band, a score block may compute masked columns up to the
// next 32 and a value block masked pairs (zeros) up to the next 16: the contract allows both.
POSENC_AMX_TARGET void Gemm(Bf16Form form, I M, I N, I P, float alpha, const Pair* A, I lda, const Pair* B, I ldb,
                            float* C, I ldc, I band) {
  const bool acc = form == Bf16Form::kValues;
  constexpr int kFull = -2;
  int current = -1;
  for (I i0 = 0; i0 < M; i0 += 32) {
    const I mb = std::min<I>(32, M - i0);
    I n = N, p = P;
    BandExtent(form, i0, mb, band, &n, &p);
    n = std::min<I>(N, (n + 31) / 32 * 32);
    p = std::min<I>(P, (p + 15) / 16 * 16);
    if (acc && p == 0) continue;
    const bool whole = mb == 32 && p % 16 == 0 && (!acc || alpha == 1.f);
    const Pair* a = A + i0 * lda;
    for (I j0 = 0; j0 < n; j0 += 32) {
      float* c = C + i0 * ldc + j0;
      if (whole && j0 + 32 <= n) {
        if (current != kFull) {
          ConfigureFull();
          current = kFull;
        }
        Block2x2(a, lda, B + j0, ldb, p, c, ldc, acc);
        if (!acc && alpha != 1.f) {
          const __m512 al = _mm512_set1_ps(alpha);
          for (int r = 0; r < 32; ++r)
            for (int v = 0; v < 2; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(c + r * ldc + 16 * v), al));
        }
        continue;
      }
      for (I ii = 0; ii < mb; ii += 16)
        for (I jj = j0; jj < std::min(n, j0 + 32); jj += 16)
          Tile1(a + ii * lda, lda, B + jj, ldb, p, alpha, acc, C + (i0 + ii) * ldc + jj, ldc,
                static_cast<int>(std::min<I>(16, mb - ii)), static_cast<int>(std::min<I>(16, n - jj)), &current);
    }
  }
  if (current != -1) _tile_release();
}

}  // namespace amx

namespace {

constexpr Bf16Ops kAmx{amx::Gemm, native::RoundRows, native::TransposePairs, native::InterleaveRows, "amx"};
constexpr Bf16Ops kNative{native::Gemm, native::RoundRows, native::TransposePairs, native::InterleaveRows,
                          "vdpbf16"};
constexpr Bf16Ops kEmulated{emulated::Gemm, emulated::RoundRows, emulated::TransposePairs,
                            emulated::InterleaveRows, "emulated"};

// AVX-512 F, DQ, BW and VL, with the OS saving the opmask and all 32 zmm registers.
bool cpu_has_avx512() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0xe6u) != 0xe6u) return false;  // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const unsigned need = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);  // F, DQ, BW, VL
  return (b & need) == need;
}

bool cpu_bf16() {
  unsigned a, b, c, d;
  if (!cpu_has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return false;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));  // AVX512_BF16
}

// AMX-TILE and AMX-BF16, the OS saving the tiles and granting this process their data (Linux:
// arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, once per process).
bool cpu_amx() {
  unsigned a, b, c, d;
  if (!cpu_bf16() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if ((d & ((1u << 22) | (1u << 24))) != ((1u << 22) | (1u << 24))) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG, XTILEDATA
#if defined(__linux__)
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
  return false;
#endif
}

}  // namespace

#else

namespace {
bool cpu_bf16() { return false; }
bool cpu_amx() { return false; }
}  // namespace

#endif

namespace {
std::atomic<Bf16Mode> mode{Bf16Mode::kAuto};
}

bool cpu_has_avx512_bf16() {
  static const bool has = cpu_bf16();
  return has;
}

bool cpu_has_amx_bf16() {
  static const bool has = cpu_amx();
  return has;
}

const Bf16Ops* bf16_ops() {
#if POSENC_HAVE_BF16_KERNELS
  switch (mode.load(std::memory_order_relaxed)) {
    case Bf16Mode::kAuto:
      if (cpu_has_amx_bf16()) return &kAmx;
      return fast::amd_cpu() && cpu_has_avx512_bf16() ? &kNative : nullptr;
    case Bf16Mode::kAmx: return cpu_has_amx_bf16() ? &kAmx : nullptr;
    case Bf16Mode::kVdpbf16: return cpu_has_avx512_bf16() ? &kNative : nullptr;
    case Bf16Mode::kEmulated: {
      static const bool avx512 = cpu_has_avx512();
      return avx512 ? &kEmulated : nullptr;
    }
    default: return nullptr;
  }
#else
  return nullptr;
#endif
}

void bf16_set_mode(Bf16Mode m) { mode.store(m, std::memory_order_relaxed); }

}  // namespace posenc::attn_fast
