/* tests/capi/test_c_api_attention.c — attention through the C ABI against a softmax written here in
   double (ALiBi, T5), T5's weight gradient against finite differences, and per-thread errors. */
#include <pthread.h>
#include <stdlib.h>

#include "capi_testing.h"

/* out [B, M, Hq, D] and lse [B, Hq, M] of softmax(scale·q·kᵀ + bias(h, qp, kp)) with the causal mask;
   query i at qoff + i, key j at j; kv head h / (Hq / Hkv). */
typedef double (*bias_fn)(int64_t h, int64_t qp, int64_t kp, const void* ctx);

static void ref_attention(const double* q, const double* k, const double* v, int64_t B, int64_t M, int64_t N,
                          int64_t Hq, int64_t Hkv, int64_t D, int causal, bias_fn bias, const void* ctx,
                          double* out, double* lse) {
  const int64_t qoff = N - M, G = Hq / Hkv;
  const double scale = 1.0 / sqrt((double)D);
  double* lg = malloc(sizeof(double) * (size_t)N);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < M; ++i) {
        const double* qi = q + ((b * M + i) * Hq + h) * D;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < N; ++j) {
          const double* kj = k + ((b * N + j) * Hkv + h / G) * D;
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += qi[d] * kj[d];
          lg[j] = (causal && j > qoff + i) ? -INFINITY : scale * s + bias(h, qoff + i, j, ctx);
          mx = fmax(mx, lg[j]);
        }
        for (int64_t j = 0; j < N; ++j) sum += exp(lg[j] - mx);
        double* oi = out + ((b * M + i) * Hq + h) * D;
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < N; ++j) acc += exp(lg[j] - mx) / sum * v[((b * N + j) * Hkv + h / G) * D + d];
          oi[d] = acc;
        }
        if (lse) lse[(b * Hq + h) * M + i] = mx + log(sum);
      }
  free(lg);
}

/* ALiBi's paper slopes for Hq = 4: 2^(-8(h+1)/4). */
static double alibi_bias(int64_t h, int64_t qp, int64_t kp, const void* ctx) {
  (void)ctx;
  return -pow(2.0, -2.0 * (double)(h + 1)) * fabs((double)(qp - kp));
}

static void alibi_f64(void) {
  enum { B = 2, M = 4, N = 6, HQ = 4, HKV = 2, D = 8 };
  double q[B * M * HQ * D], k[B * N * HKV * D], v[B * N * HKV * D], out[B * M * HQ * D], lse[B * HQ * M];
  double rout[B * M * HQ * D], rlse[B * HQ * M];
  const int64_t sq[4] = {B, M, HQ, D}, sk[4] = {B, N, HKV, D}, sl[3] = {B, HQ, M};
  fill(q, B * M * HQ * D, 11);
  fill(k, B * N * HKV * D, 12);
  fill(v, B * N * HKV * D, 13);
  posenc_attention_params* p = posenc_attention_params_new("alibi");
  CHECK(p != NULL, "alibi: %s", posenc_last_error());
  CHECK(posenc_attention_params_set(p, "causal", "true") == POSENC_OK, "%s", posenc_last_error());
  posenc_tensor tq = tensor(q, POSENC_F64, 4, sq), tk = tensor(k, POSENC_F64, 4, sk), tv = tensor(v, POSENC_F64, 4, sk);
  posenc_tensor to = tensor(out, POSENC_F64, 4, sq), tl = tensor(lse, POSENC_F64, 3, sl);
  CHECK(posenc_attention_forward(p, &tq, &tk, &tv, &to, &tl) == POSENC_OK, "%s", posenc_last_error());
  ref_attention(q, k, v, B, M, N, HQ, HKV, D, 1, alibi_bias, NULL, rout, rlse);
  CHECK(max_abs_diff(out, rout, B * M * HQ * D) < 1e-12, "alibi out off %g", max_abs_diff(out, rout, B * M * HQ * D));
  CHECK(max_abs_diff(lse, rlse, B * HQ * M) < 1e-12, "alibi lse off %g", max_abs_diff(lse, rlse, B * HQ * M));
  posenc_attention_params_free(p);
}

/* Large enough for the fused float32 kernel (B·Hq·M·N = 2^14 pairs). */
static void alibi_f32(void) {
  enum { M = 64, N = 64, H = 4, D = 16, NQ = M * H * D };
  static double q[NQ], k[NQ], v[NQ], rout[NQ];
  static float qf[NQ], kf[NQ], vf[NQ], of[NQ];
  const int64_t s[4] = {1, M, H, D};
  fill(q, NQ, 21);
  fill(k, NQ, 22);
  fill(v, NQ, 23);
  for (int i = 0; i < NQ; ++i) {
    qf[i] = (float)q[i], kf[i] = (float)k[i], vf[i] = (float)v[i];
    q[i] = qf[i], k[i] = kf[i], v[i] = vf[i];
  }
  posenc_attention_params* p = posenc_attention_params_new("alibi");
  posenc_attention_params_set(p, "causal", "1");
  posenc_tensor tq = tensor(qf, POSENC_F32, 4, s), tk = tensor(kf, POSENC_F32, 4, s), tv = tensor(vf, POSENC_F32, 4, s);
  posenc_tensor to = tensor(of, POSENC_F32, 4, s);
  CHECK(posenc_attention_forward(p, &tq, &tk, &tv, &to, NULL) == POSENC_OK, "%s", posenc_last_error());
  ref_attention(q, k, v, 1, M, N, H, H, D, 1, alibi_bias, NULL, rout, NULL);
  double err = 0;
  for (int i = 0; i < NQ; ++i) err = fmax(err, fabs(of[i] - rout[i]));
  CHECK(err < 2e-5, "alibi float32 off %g", err);
  posenc_attention_params_free(p);
}

/* T5: Hugging Face's _relative_position_bucket (its log bucket in float32), bidirectional. */
typedef struct { const double* w; int64_t nb, maxd, H; } t5_ctx;

static int64_t t5_bucket(int64_t rel, int64_t nb, int64_t maxd) {
  nb /= 2;
  int64_t ret = rel > 0 ? nb : 0;
  const int64_t n = rel < 0 ? -rel : rel, exact = nb / 2;
  if (n < exact) return ret + n;
  const float f = logf((float)n / (float)exact) / (float)log((double)maxd / (double)exact) * (float)(nb - exact);
  const int64_t large = exact + (int64_t)f;
  return ret + (large < nb - 1 ? large : nb - 1);
}

static double t5_bias(int64_t h, int64_t qp, int64_t kp, const void* ctx) {
  const t5_ctx* c = ctx;
  return c->w[t5_bucket(kp - qp, c->nb, c->maxd) * c->H + h];
}

enum { TB = 1, TM = 7, TN = 8, TH = 2, TD = 4, TNB = 16, TQ = TB * TM * TH * TD, TK = TB * TN * TH * TD };

/* Σ dout·out of a T5 forward (the loss whose gradient the backward gives). */
static double t5_loss(posenc_attention_params* p, double* q, double* k, double* v, const double* dout) {
  double out[TQ];
  const int64_t sq[4] = {TB, TM, TH, TD}, sk[4] = {TB, TN, TH, TD};
  posenc_tensor tq = tensor(q, POSENC_F64, 4, sq), tk = tensor(k, POSENC_F64, 4, sk), tv = tensor(v, POSENC_F64, 4, sk);
  posenc_tensor to = tensor(out, POSENC_F64, 4, sq);
  if (posenc_attention_forward(p, &tq, &tk, &tv, &to, NULL) != POSENC_OK) return NAN;
  double s = 0;
  for (int i = 0; i < TQ; ++i) s += dout[i] * out[i];
  return s;
}

static void t5_f64(void) {
  double q[TQ], k[TK], v[TK], dout[TQ], out[TQ], rout[TQ], w[TNB * TH], dw[TNB * TH], dq[TQ];
  const int64_t sq[4] = {TB, TM, TH, TD}, sk[4] = {TB, TN, TH, TD}, sw[2] = {TNB, TH};
  fill(q, TQ, 31);
  fill(k, TK, 32);
  fill(v, TK, 33);
  fill(dout, TQ, 34);
  fill(w, TNB * TH, 35);
  posenc_attention_params* p = posenc_attention_params_new("t5");
  CHECK(posenc_attention_params_set(p, "num_buckets", "16") == POSENC_OK, "%s", posenc_last_error());
  CHECK(posenc_attention_params_set(p, "max-distance", "20") == POSENC_OK, "%s", posenc_last_error());
  posenc_tensor tw = tensor(w, POSENC_F64, 2, sw), tdw = tensor(dw, POSENC_F64, 2, sw);
  CHECK(posenc_attention_set_tensor(p, "weights", &tw) == POSENC_OK, "%s", posenc_last_error());
  posenc_tensor tq = tensor(q, POSENC_F64, 4, sq), tk = tensor(k, POSENC_F64, 4, sk), tv = tensor(v, POSENC_F64, 4, sk);
  posenc_tensor to = tensor(out, POSENC_F64, 4, sq), tdo = tensor(dout, POSENC_F64, 4, sq);
  posenc_tensor tdq = tensor(dq, POSENC_F64, 4, sq);
  CHECK(posenc_attention_forward(p, &tq, &tk, &tv, &to, NULL) == POSENC_OK, "%s", posenc_last_error());
  const t5_ctx ctx = {w, TNB, 20, TH};
  ref_attention(q, k, v, TB, TM, TN, TH, TH, TD, 0, t5_bias, &ctx, rout, NULL);
  CHECK(max_abs_diff(out, rout, TQ) < 1e-12, "t5 out off %g", max_abs_diff(out, rout, TQ));
  CHECK(posenc_attention_set_grad(p, "weights", &tdw) == POSENC_OK, "%s", posenc_last_error());
  CHECK(posenc_attention_backward(p, &tq, &tk, &tv, &tdo, &tdq, NULL, NULL) == POSENC_OK, "%s", posenc_last_error());
  const double h = 1e-6;
  double err = 0, gmax = 0;
  for (int i = 0; i < TNB * TH; ++i) {
    const double w0 = w[i];
    w[i] = w0 + h;
    const double up = t5_loss(p, q, k, v, dout);
    w[i] = w0 - h;
    const double down = t5_loss(p, q, k, v, dout);
    w[i] = w0;
    err = fmax(err, fabs((up - down) / (2 * h) - dw[i]));
    gmax = fmax(gmax, fabs(dw[i]));
  }
  CHECK(err < 1e-7 && gmax > 1e-3, "t5 dweights off %g (largest %g)", err, gmax);
  err = 0;
  for (int i = 0; i < TQ; i += 5) {
    const double q0 = q[i];
    q[i] = q0 + h;
    const double up = t5_loss(p, q, k, v, dout);
    q[i] = q0 - h;
    const double down = t5_loss(p, q, k, v, dout);
    q[i] = q0;
    err = fmax(err, fabs((up - down) / (2 * h) - dq[i]));
  }
  CHECK(err < 1e-7, "t5 dq off %g", err);
  posenc_attention_params_free(p);
}

/* posenc_attention_backward_saved given the forward's own out and lse. posenc_attention_backward_from_stats:
   the keys in two shards of TN/2 (k_offset 0 and TN/2, the queries at the whole call's q_offset N - M),
   each shard's backward under the whole forward's out and lse; dq and dweights summed, dk
   concatenated, against the unsharded backward. */
static void t5_shards_f64(void) {
  enum { S = TN / 2, TS = TB * S * TH * TD };
  double q[TQ], k[TK], v[TK], dout[TQ], out[TQ], lse[TB * TH * TM], w[TNB * TH];
  double dq[TQ], dk[TK], dw[TNB * TH], sdq[TQ] = {0}, sdk[TK], sdw[TNB * TH] = {0}, pdq[TQ], pdw[TNB * TH];
  const int64_t sq[4] = {TB, TM, TH, TD}, sk[4] = {TB, TN, TH, TD}, ss[4] = {TB, S, TH, TD};
  const int64_t sl[3] = {TB, TH, TM}, sw[2] = {TNB, TH};
  fill(q, TQ, 41);
  fill(k, TK, 42);
  fill(v, TK, 43);
  fill(dout, TQ, 44);
  fill(w, TNB * TH, 45);
  posenc_attention_params* p = posenc_attention_params_new("t5");
  CHECK(posenc_attention_params_set(p, "causal", "true") == POSENC_OK, "%s", posenc_last_error());
  CHECK(posenc_attention_params_set(p, "num_buckets", "16") == POSENC_OK, "%s", posenc_last_error());
  posenc_tensor tw = tensor(w, POSENC_F64, 2, sw), tdw = tensor(dw, POSENC_F64, 2, sw);
  CHECK(posenc_attention_set_tensor(p, "weights", &tw) == POSENC_OK, "%s", posenc_last_error());
  posenc_tensor tq = tensor(q, POSENC_F64, 4, sq), tk = tensor(k, POSENC_F64, 4, sk), tv = tensor(v, POSENC_F64, 4, sk);
  posenc_tensor to = tensor(out, POSENC_F64, 4, sq), tl = tensor(lse, POSENC_F64, 3, sl);
  posenc_tensor tdo = tensor(dout, POSENC_F64, 4, sq), tdq = tensor(dq, POSENC_F64, 4, sq);
  posenc_tensor tdk = tensor(dk, POSENC_F64, 4, sk);
  CHECK(posenc_attention_forward(p, &tq, &tk, &tv, &to, &tl) == POSENC_OK, "%s", posenc_last_error());
  CHECK(posenc_attention_set_grad(p, "weights", &tdw) == POSENC_OK, "%s", posenc_last_error());
  CHECK(posenc_attention_backward(p, &tq, &tk, &tv, &tdo, &tdq, &tdk, NULL) == POSENC_OK, "%s", posenc_last_error());
  { /* posenc_attention_backward_saved given that forward's out and lse: the same gradients; without
       lse, an error naming it */
    double gq[TQ], gk[TK], gw[TNB * TH];
    posenc_tensor tgq = tensor(gq, POSENC_F64, 4, sq), tgk = tensor(gk, POSENC_F64, 4, sk);
    posenc_tensor tgw = tensor(gw, POSENC_F64, 2, sw);
    CHECK(posenc_attention_set_grad(p, "weights", &tgw) == POSENC_OK, "%s", posenc_last_error());
    CHECK(posenc_attention_backward_saved(p, &tq, &tk, &tv, &to, &tl, &tdo, &tgq, &tgk, NULL) == POSENC_OK, "%s",
          posenc_last_error());
    CHECK(max_abs_diff(gq, dq, TQ) == 0 && max_abs_diff(gk, dk, TK) == 0 && max_abs_diff(gw, dw, TNB * TH) == 0,
          "saved backward off: dq %g dk %g", max_abs_diff(gq, dq, TQ), max_abs_diff(gk, dk, TK));
    CHECK(posenc_attention_backward_saved(p, &tq, &tk, &tv, &to, NULL, &tdo, &tgq, &tgk, NULL) != POSENC_OK &&
              strstr(posenc_last_error(), "lse") != NULL,
          "missing lse: %s", posenc_last_error());
  }
  char qo[32];
  snprintf(qo, sizeof qo, "%d", TN - TM);
  CHECK(posenc_attention_params_set(p, "q_offset", qo) == POSENC_OK, "%s", posenc_last_error());
  posenc_tensor tpdw = tensor(pdw, POSENC_F64, 2, sw), tpdq = tensor(pdq, POSENC_F64, 4, sq);
  CHECK(posenc_attention_set_grad(p, "weights", &tpdw) == POSENC_OK, "%s", posenc_last_error());
  for (int s = 0; s < 2; ++s) { /* TB = 1: shard s is rows s*S .. s*S + S - 1 */
    char ko[32];
    snprintf(ko, sizeof ko, "%d", s * S);
    CHECK(posenc_attention_params_set(p, "k_offset", ko) == POSENC_OK, "%s", posenc_last_error());
    posenc_tensor tks = tensor(k + s * TS, POSENC_F64, 4, ss), tvs = tensor(v + s * TS, POSENC_F64, 4, ss);
    posenc_tensor tdks = tensor(sdk + s * TS, POSENC_F64, 4, ss);
    CHECK(posenc_attention_backward_from_stats(p, &tq, &tks, &tvs, &to, &tl, &tdo, &tpdq, &tdks, NULL) == POSENC_OK,
          "%s", posenc_last_error());
    for (int i = 0; i < TQ; ++i) sdq[i] += pdq[i];
    for (int i = 0; i < TNB * TH; ++i) sdw[i] += pdw[i];
  }
  CHECK(max_abs_diff(sdq, dq, TQ) < 1e-12, "shards dq off %g", max_abs_diff(sdq, dq, TQ));
  CHECK(max_abs_diff(sdk, dk, TK) < 1e-12, "shards dk off %g", max_abs_diff(sdk, dk, TK));
  CHECK(max_abs_diff(sdw, dw, TNB * TH) < 1e-12, "shards dweights off %g", max_abs_diff(sdw, dw, TNB * TH));
  /* a shard without its statistics is an error naming them */
  CHECK(posenc_attention_backward_from_stats(p, &tq, &tk, &tv, NULL, &tl, &tdo, &tpdq, NULL, NULL) != POSENC_OK &&
            strstr(posenc_last_error(), "out") != NULL,
        "missing out: %s", posenc_last_error());
  posenc_attention_params_free(p);
}

void test_attention(void) {
  alibi_f64();
  alibi_f32();
  t5_f64();
  t5_shards_f64();
}

/* Two threads, each failing its own way many times: each reads back only its own message. */
static void* fail_loop(void* arg) {
  const int which = *(const int*)arg;
  posenc_rope_params* p = posenc_rope_params_new();
  long bad = 0;
  for (int i = 0; i < 2000; ++i) {
    const int rc = which ? posenc_rope_params_set(p, "theta", "abc") : posenc_rope_params_set(p, "no_such_key", "1");
    const char* m = posenc_last_error();
    if (rc == POSENC_OK || strstr(m, which ? "theta: expected a finite number" : "no_such_key: unknown") == NULL ||
        strstr(m, which ? "no_such_key" : "finite number") != NULL)
      ++bad;
  }
  posenc_rope_params_free(p);
  return (void*)bad;
}

void test_threads(void) {
  pthread_t t[2];
  int which[2] = {0, 1};
  for (int i = 0; i < 2; ++i) pthread_create(&t[i], NULL, fail_loop, &which[i]);
  for (int i = 0; i < 2; ++i) {
    void* bad = NULL;
    pthread_join(t[i], &bad);
    CHECK(bad == NULL, "thread %d saw %ld foreign or missing messages", i, (long)bad);
  }
}
