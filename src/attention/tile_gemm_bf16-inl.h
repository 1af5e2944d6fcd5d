// Private, included twice by tile_gemm_bf16.cc (no include guard): the bfloat16-pair kernels of
// tile_gemm_bf16.h in namespace POSENC_BF16_NS, each function compiled for POSENC_BF16_TARGET; with
// POSENC_BF16_NATIVE the pair products are VDPBF16PS, else two float32 multiply-adds (high halves
// first, as the instruction sums them).

namespace POSENC_BF16_NS {

using I = std::int64_t;

POSENC_BF16_TARGET inline __mmask16 Lanes(I n) {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u);
}

// acc + a ⋅ b, pair by pair.
POSENC_BF16_TARGET inline __m512 Dot2(__m512 acc, __m512i a, __m512i b) {
#if POSENC_BF16_NATIVE
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
#else
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512 ah = _mm512_castsi512_ps(_mm512_and_si512(a, hi));
  const __m512 bh = _mm512_castsi512_ps(_mm512_and_si512(b, hi));
  const __m512 al = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
  const __m512 bl = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
  return _mm512_fmadd_ps(al, bl, _mm512_fmadd_ps(ah, bh, acc));
#endif
}

// 16 floats rounded to bfloat16 (nearest, ties to even; a NaN stays a quiet NaN; a denormal
// becomes a zero of its sign, as VCVTNEPS2BF16 reads it).
POSENC_BF16_TARGET inline __m256i Round16(__m512 x) {
#if POSENC_BF16_NATIVE
  return (__m256i)_mm512_cvtneps_pbh(x);
#else
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  const __mmask16 tiny = _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_and_epi32(r, tiny, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x8000));
  return _mm512_cvtepi32_epi16(r);
#endif
}

// C rows [0, R) × vectors [0, NV) of 16 columns (the last one `last` lanes) of a product: Σ over
// pairs [0, P).
template <int R, int NV>
POSENC_BF16_TARGET inline void Block(const Pair* A, I lda, const Pair* B, I ldb, I P, float alpha, bool acc,
                                     float* C, I ldc, __mmask16 last) {
  __m512 c[R][NV];
  HWY_UNROLL(6)
  for (int r = 0; r < R; ++r)
    HWY_UNROLL(4)
    for (int v = 0; v < NV; ++v) c[r][v] = _mm512_setzero_ps();
  for (I p = 0; p < P; ++p) {
    const Pair* b = B + p * ldb;
    __m512i bv[NV];
    HWY_UNROLL(4)
    for (int v = 0; v < NV; ++v)
      bv[v] = v + 1 < NV ? _mm512_loadu_si512(b + 16 * v) : _mm512_maskz_loadu_epi32(last, b + 16 * v);
    HWY_UNROLL(6)
    for (int r = 0; r < R; ++r) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(A[r * lda + p]));
      HWY_UNROLL(4)
      for (int v = 0; v < NV; ++v) c[r][v] = Dot2(c[r][v], a, bv[v]);
    }
  }
  const __m512 al = _mm512_set1_ps(alpha);
  HWY_UNROLL(6)
  for (int r = 0; r < R; ++r)
    HWY_UNROLL(4)
    for (int v = 0; v < NV; ++v) {
      float* y = C + r * ldc + 16 * v;
      const __mmask16 m = v + 1 < NV ? __mmask16(0xffff) : last;
      __m512 x = _mm512_mul_ps(c[r][v], al);
      if (acc) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, y));
      _mm512_mask_storeu_ps(y, m, x);
    }
}

// R rows: every column block of up to 4 vectors.
template <int R>
POSENC_BF16_TARGET inline void Rows(const Pair* A, I lda, const Pair* B, I ldb, I N, I P, float alpha, bool acc,
                                    float* C, I ldc) {
  I j = 0;
  for (; j + 64 <= N; j += 64) Block<R, 4>(A, lda, B + j, ldb, P, alpha, acc, C + j, ldc, 0xffff);
  const I rest = N - j;
  if (rest <= 0) return;
  const __mmask16 last = Lanes(rest - 16 * ((rest - 1) / 16));
  switch ((rest + 15) / 16) {
    case 1: Block<R, 1>(A, lda, B + j, ldb, P, alpha, acc, C + j, ldc, last); break;
    case 2: Block<R, 2>(A, lda, B + j, ldb, P, alpha, acc, C + j, ldc, last); break;
    case 3: Block<R, 3>(A, lda, B + j, ldb, P, alpha, acc, C + j, ldc, last); break;
    default: Block<R, 4>(A, lda, B + j, ldb, P, alpha, acc, C + j, ldc, last); break;
  }
}

POSENC_BF16_TARGET void Gemm(Bf16Form form, I M, I N, I P, float alpha, const Pair* A, I lda, const Pair* B,
                             I ldb, float* C, I ldc, I band) {
  constexpr I kR = 6;
  for (I i = 0; i < M; i += kR) {
    const I rows = std::min(kR, M - i);
    I n = N, p = P;
    BandExtent(form, i, rows, band, &n, &p);
    if (n == 0 || (form == Bf16Form::kValues && p == 0)) continue;
    const bool acc = form == Bf16Form::kValues;
    const Pair* a = A + i * lda;
    float* c = C + i * ldc;
    switch (rows) {
      case 6: Rows<6>(a, lda, B, ldb, n, p, alpha, acc, c, ldc); break;
      case 5: Rows<5>(a, lda, B, ldb, n, p, alpha, acc, c, ldc); break;
      case 4: Rows<4>(a, lda, B, ldb, n, p, alpha, acc, c, ldc); break;
      case 3: Rows<3>(a, lda, B, ldb, n, p, alpha, acc, c, ldc); break;
      case 2: Rows<2>(a, lda, B, ldb, n, p, alpha, acc, c, ldc); break;
      default: Rows<1>(a, lda, B, ldb, n, p, alpha, acc, c, ldc); break;
    }
  }
}

POSENC_BF16_TARGET void RoundRows(const float* x, I ld, I n, I K, Pair* out, I ldo) {
  for (I r = 0; r < n; ++r) {
    const float* src = x + r * ld;
    auto* dst = reinterpret_cast<std::uint16_t*>(out + r * ldo);
    const I Kp = 2 * ((K + 1) / 2);  // an odd K's pad element: the masked load's 0
    I e = 0;
    for (; e + 16 <= K; e += 16)  // whole vectors unmasked: masked stores cost more (Zen 4 and 5)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + e), Round16(_mm512_loadu_ps(src + e)));
    for (; e < Kp; e += 16) {
      const __mmask16 m = Lanes(K - e), mo = Lanes(Kp - e);
      _mm256_mask_storeu_epi16(dst + e, mo, Round16(_mm512_maskz_loadu_ps(m, src + e)));
    }
  }
}

// 16 rows of 16 dwords transposed in registers (r[i] lane j → r[j] lane i).
POSENC_BF16_TARGET inline void Transpose16(__m512i* r) {
  __m512i t[16], u[16];
  HWY_UNROLL(8)
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + c], 128-bit lane L: rows 4i … 4i + 3 of column 4L + c
  HWY_UNROLL(4)
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  HWY_UNROLL(4)
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
    r[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(v0, w0, 0xdd);
    r[4 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
  }
}

POSENC_BF16_TARGET void TransposePairs(const std::uint16_t* x, I ld, I n, I P, Pair* out, I ldo) {
  for (I j = 0; j < n; j += 16) {
    for (I p = 0; p < P; p += 16) {
      const __mmask16 m = Lanes(P - p);
      __m512i r[16];
      for (I i = 0; i < 16; ++i)
        r[i] = j + i < n ? _mm512_maskz_loadu_epi32(m, x + (j + i) * ld + 2 * p) : _mm512_setzero_si512();
      Transpose16(r);
      for (I i = 0; i < 16 && p + i < P; ++i) _mm512_storeu_si512(out + (p + i) * ldo + j, r[i]);
    }
  }
}

POSENC_BF16_TARGET void InterleaveRows(const std::uint16_t* x, I ld, I n, I K, Pair* out, I ldo) {
  for (I p = 0; 2 * p < n; ++p) {
    const std::uint16_t* lo = x + 2 * p * ld;
    const std::uint16_t* hi = lo + ld;
    const bool has_hi = 2 * p + 1 < n;
    for (I e = 0; e < K; e += 16) {
      const __mmask16 m = Lanes(K - e);
      const __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + e));
      const __m512i b = has_hi ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, hi + e)) : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(out + p * ldo + e, m, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    }
  }
}

}  // namespace POSENC_BF16_NS
