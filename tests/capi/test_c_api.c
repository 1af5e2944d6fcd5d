/* tests/capi/test_c_api.c — the C ABI from C11: RoPE against a rotation written here in double, its
   errors, and (test_c_api_attention.c) attention and per-thread errors. Last line: "N passed, M failed". */
#include <stdlib.h>

#include "capi_testing.h"

int g_passed = 0, g_failed = 0;

enum { B = 2, L = 5, HQ = 3, HK = 1, D = 8 };

/* q [B, L, HQ, D] and k [B, L, HK, D] rotated in float64 against ref_rope. */
static void rope_f64_case(const char* layout, const int64_t* ids, int64_t offset, int backward) {
  static double q[B * L * HQ * D], k[B * L * HK * D], qo[B * L * HQ * D], ko[B * L * HK * D];
  static double rq[B * L * HQ * D], rk[B * L * HK * D];
  const int64_t sq[4] = {B, L, HQ, D}, sk[4] = {B, L, HK, D}, sp[1] = {L};
  fill(q, B * L * HQ * D, 1);
  fill(k, B * L * HK * D, 2);
  posenc_rope_params* p = posenc_rope_params_new();
  CHECK(posenc_rope_params_set(p, "layout", layout) == POSENC_OK, "layout: %s", posenc_last_error());
  CHECK(posenc_rope_params_set(p, "theta", "500") == POSENC_OK, "theta: %s", posenc_last_error());
  posenc_tensor tq = tensor(q, POSENC_F64, 4, sq), tk = tensor(k, POSENC_F64, 4, sk);
  posenc_tensor tqo = tensor(qo, POSENC_F64, 4, sq), tko = tensor(ko, POSENC_F64, 4, sk);
  posenc_tensor tp = tensor((void*)ids, POSENC_I64, 1, sp);
  const int rc = posenc_rope_qk(p, &tq, &tk, ids ? &tp : NULL, offset, &tqo, &tko, backward);
  CHECK(rc == POSENC_OK, "rope_qk %s: %s", layout, posenc_last_error());
  int64_t pos[B * L];
  double w[D / 2];
  for (int64_t i = 0; i < B * L; ++i) pos[i] = (ids ? ids[i % L] : i % L) + offset;
  rope_freqs(w, D, 500.0);
  const int half = strcmp(layout, "half") == 0;
  ref_rope(q, rq, B, L, HQ, D, pos, w, half, backward ? -1.0 : 1.0);
  ref_rope(k, rk, B, L, HK, D, pos, w, half, backward ? -1.0 : 1.0);
  CHECK(max_abs_diff(qo, rq, B * L * HQ * D) < 1e-12, "q %s off %g", layout, max_abs_diff(qo, rq, B * L * HQ * D));
  CHECK(max_abs_diff(ko, rk, B * L * HK * D) < 1e-12, "k %s off %g", layout, max_abs_diff(ko, rk, B * L * HK * D));
  posenc_rope_params_free(p);
}

/* backward(forward(x)) = x, in place. */
static void rope_inverse(void) {
  double x[B * L * HQ * D], x0[B * L * HQ * D];
  const int64_t s[4] = {B, L, HQ, D};
  fill(x, B * L * HQ * D, 3);
  memcpy(x0, x, sizeof x);
  posenc_rope_params* p = posenc_rope_params_new();
  posenc_tensor t = tensor(x, POSENC_F64, 4, s);
  CHECK(posenc_rope_qk(p, &t, NULL, NULL, 1000, &t, NULL, 0) == POSENC_OK, "%s", posenc_last_error());
  CHECK(max_abs_diff(x, x0, B * L * HQ * D) > 0.1, "forward moved nothing");
  CHECK(posenc_rope_qk(p, &t, NULL, NULL, 1000, &t, NULL, 1) == POSENC_OK, "%s", posenc_last_error());
  CHECK(max_abs_diff(x, x0, B * L * HQ * D) < 1e-12, "inverse off %g", max_abs_diff(x, x0, B * L * HQ * D));
  posenc_rope_params_free(p);
}

/* float32 (tolerance 2e-6) and bfloat16 (one bfloat16 rounding of the output: 2^-8 relative). */
static void rope_narrow(void) {
  enum { N = 1 * 16 * 2 * 32 };
  const int64_t s[4] = {1, 16, 2, 32};
  double x[N], r[N], w[16];
  float xf[N], yf[N];
  uint16_t xb[N], yb[N];
  int64_t pos[16];
  fill(x, N, 4);
  for (int i = 0; i < N; ++i) {
    xf[i] = (float)x[i];
    xb[i] = to_bf16(xf[i]);
  }
  for (int i = 0; i < 16; ++i) pos[i] = 100 + i;
  rope_freqs(w, 32, 10000.0);
  posenc_rope_params* p = posenc_rope_params_new();
  posenc_rope_params_set(p, "layout", "half");
  posenc_tensor tx = tensor(xf, POSENC_F32, 4, s), ty = tensor(yf, POSENC_F32, 4, s);
  CHECK(posenc_rope_qk(p, &tx, NULL, NULL, 100, &ty, NULL, 0) == POSENC_OK, "f32: %s", posenc_last_error());
  for (int i = 0; i < N; ++i) x[i] = xf[i];
  ref_rope(x, r, 1, 16, 2, 32, pos, w, 1, 1.0);
  double err = 0;
  for (int i = 0; i < N; ++i) err = fmax(err, fabs(yf[i] - r[i]));
  CHECK(err < 2e-6, "float32 off %g", err);
  tx = tensor(xb, POSENC_BF16, 4, s);
  ty = tensor(yb, POSENC_BF16, 4, s);
  CHECK(posenc_rope_qk(p, &tx, NULL, NULL, 100, &ty, NULL, 0) == POSENC_OK, "bf16: %s", posenc_last_error());
  for (int i = 0; i < N; ++i) x[i] = from_bf16(xb[i]);
  ref_rope(x, r, 1, 16, 2, 32, pos, w, 1, 1.0);
  err = 0;
  for (int i = 0; i < N; ++i) err = fmax(err, fabs(from_bf16(yb[i]) - r[i]) / fmax(fabs(r[i]), 1e-3));
  CHECK(err <= 1.0 / 256, "bfloat16 off %g (relative)", err);
  posenc_rope_params_free(p);
}

/* q a strided slice (every other element of a padded row), output into a padded buffer: the padding
   stays untouched. */
static void rope_strided(void) {
  enum { LL = 4, H = 2, DD = 6, PAD = 3 };
  double big[LL * H * 2 * DD], outb[LL * H * (DD + PAD)], x[LL * H * DD], r[LL * H * DD], w[DD / 2];
  int64_t pos[LL] = {0, 1, 2, 3};
  fill(big, LL * H * 2 * DD, 5);
  set_all(outb, LL * H * (DD + PAD), -7.0);
  posenc_tensor tq = {big, POSENC_F64, 4, {1, LL, H, DD}, {0, H * 2 * DD, 2 * DD, 2}};
  posenc_tensor to = {outb, POSENC_F64, 4, {1, LL, H, DD}, {0, H * (DD + PAD), DD + PAD, 1}};
  posenc_rope_params* p = posenc_rope_params_new();
  CHECK(posenc_rope_qk(p, &tq, NULL, NULL, 0, &to, NULL, 0) == POSENC_OK, "strided: %s", posenc_last_error());
  for (int i = 0; i < LL * H * DD; ++i) x[i] = big[2 * i];
  rope_freqs(w, DD, 10000.0);
  ref_rope(x, r, 1, LL, H, DD, pos, w, 1, 1.0); /* the default layout: half */
  double err = 0;
  int pad_ok = 1;
  for (int row = 0; row < LL * H; ++row) {
    for (int d = 0; d < DD; ++d) err = fmax(err, fabs(outb[row * (DD + PAD) + d] - r[row * DD + d]));
    for (int d = DD; d < DD + PAD; ++d) pad_ok &= outb[row * (DD + PAD) + d] == -7.0;
  }
  CHECK(err < 1e-12, "strided off %g", err);
  CHECK(pad_ok, "padding written");
  posenc_rope_params_free(p);
}

/* Llama 3.1's config: head_dim 128, theta 500000, llama3 scaling (s 8, L 8192, low 1, high 4), half. */
static const char* kLlama31 =
    "{\"hidden_size\": 4096, \"num_attention_heads\": 32, \"max_position_embeddings\": 131072,"
    " \"model_type\": \"llama\", \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 8.0,"
    " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192,"
    " \"rope_type\": \"llama3\"}}";

static void rope_config(void) {
  enum { DD = 128, LL = 3 };
  double x[LL * DD], y[LL * DD], r[LL * DD], w[DD / 2];
  int64_t pos[LL] = {5000, 5001, 5002}, head_dim = 0;
  const int64_t s[4] = {1, LL, 1, DD};
  const double pi = 3.14159265358979323846;
  for (int k = 0; k < DD / 2; ++k) { /* llama3, as Meta's reference code */
    const double w0 = pow(500000.0, -2.0 * k / DD), wavelen = 2 * pi / w0;
    if (wavelen < 8192.0 / 4.0) w[k] = w0;
    else if (wavelen > 8192.0 / 1.0) w[k] = w0 / 8.0;
    else {
      const double g = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      w[k] = (1 - g) * w0 / 8.0 + g * w0;
    }
  }
  fill(x, LL * DD, 6);
  posenc_rope_params* p = posenc_rope_params_new();
  CHECK(posenc_rope_params_from_config(p, kLlama31, &head_dim) == POSENC_OK, "config: %s", posenc_last_error());
  CHECK(head_dim == 128, "head_dim %lld", (long long)head_dim);
  posenc_tensor tx = tensor(x, POSENC_F64, 4, s), ty = tensor(y, POSENC_F64, 4, s);
  CHECK(posenc_rope_qk(p, &tx, NULL, NULL, 5000, &ty, NULL, 0) == POSENC_OK, "%s", posenc_last_error());
  ref_rope(x, r, 1, LL, 1, DD, pos, w, 1, 1.0);
  CHECK(max_abs_diff(y, r, LL * DD) < 1e-9, "llama3 off %g", max_abs_diff(y, r, LL * DD));
  posenc_rope_params_free(p);
}

void test_rope(void) {
  const int64_t ids[L] = {7, 3, 100, 0, 42};
  rope_f64_case("interleaved", NULL, 0, 0);
  rope_f64_case("half", NULL, 0, 0);
  rope_f64_case("interleaved", ids, 0, 0);
  rope_f64_case("half", ids, 9, 0);
  rope_f64_case("half", NULL, 11, 0);
  rope_f64_case("interleaved", ids, 0, 1);
  rope_f64_case("half", NULL, 3, 1);
  rope_inverse();
  rope_narrow();
  rope_strided();
  rope_config();
}

int main(void) {
  CHECK(posenc_version() != NULL && strcmp(posenc_version(), POSENC_TEST_VERSION) == 0, "version '%s'",
        posenc_version());
  CHECK(posenc_last_error() != NULL && posenc_last_error()[0] == '\0', "an error before any call");
  test_rope();
  test_rope_errors();
  test_attention();
  test_attention_errors();
  test_threads();
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
