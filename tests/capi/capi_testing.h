/* tests/capi/capi_testing.h — the C test's checks, tensors and independent references (plain C11). */
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <posenc/c_api.h>

extern int g_passed, g_failed;

/* Counts a check; prints the failing ones with their line. */
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (cond) {                                            \
      ++g_passed;                                          \
    } else {                                               \
      ++g_failed;                                          \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);          \
      printf(__VA_ARGS__);                                 \
      printf("\n");                                        \
    }                                                      \
  } while (0)

/* A call that must fail: non-zero code, a one-line message that names `arg`. */
#define CHECK_ERR(rc, arg)                                                                            \
  do {                                                                                                \
    const char* m_ = posenc_last_error();                                                             \
    CHECK((rc) != POSENC_OK && m_ != NULL && m_[0] != '\0' && strchr(m_, '\n') == NULL &&             \
              strstr(m_, (arg)) != NULL,                                                              \
          "expected an error naming '%s', got rc %d, message '%s'", (arg), (rc), m_ ? m_ : "(null)"); \
  } while (0)

/* A contiguous tensor over data. */
static inline posenc_tensor tensor(void* data, int dtype, int ndim, const int64_t* shape) {
  posenc_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  return t;
}

/* Deterministic values in [-1, 1). */
static inline double rnd(uint64_t* s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static inline void fill(double* x, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; ++i) x[i] = rnd(&seed);
}

/* bfloat16 by round-to-nearest-even, and back. */
static inline uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* True when every one of n doubles equals v (outputs left untouched by a failed call). */
static inline int all_equal(const double* x, int64_t n, double v) {
  for (int64_t i = 0; i < n; ++i)
    if (x[i] != v) return 0;
  return 1;
}
static inline void set_all(double* x, int64_t n, double v) {
  for (int64_t i = 0; i < n; ++i) x[i] = v;
}

/* RoPE in double on a contiguous [B, L, H, D] array: pair k rotated by sign·pos[b·L + l]·w[k];
   half: pairs (k, k + D/2), else (2k, 2k + 1); every dimension rotates. */
static inline void ref_rope(const double* x, double* y, int64_t B, int64_t L, int64_t H, int64_t D,
                            const int64_t* pos, const double* w, int half, double sign) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < H; ++h) {
        const double* xi = x + ((b * L + l) * H + h) * D;
        double* yi = y + ((b * L + l) * H + h) * D;
        for (int64_t k = 0; k < D / 2; ++k) {
          const int64_t ia = half ? k : 2 * k, ib = half ? k + D / 2 : 2 * k + 1;
          const double a = sign * (double)pos[b * L + l] * w[k];
          const double xa = xi[ia], xb = xi[ib];
          yi[ia] = xa * cos(a) - xb * sin(a);
          yi[ib] = xa * sin(a) + xb * cos(a);
        }
      }
}

/* RoFormer's frequencies theta^(-2k/D). */
static inline void rope_freqs(double* w, int64_t D, double theta) {
  for (int64_t k = 0; k < D / 2; ++k) w[k] = pow(theta, -2.0 * (double)k / (double)D);
}

static inline double max_abs_diff(const double* a, const double* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = fmax(m, fabs(a[i] - b[i]));
  return m;
}

void test_rope(void);
void test_rope_errors(void);
void test_attention(void);
void test_attention_errors(void);
void test_threads(void);
