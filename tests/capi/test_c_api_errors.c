/* tests/capi/test_c_api_errors.c — every error path: a non-zero code, a one-line message naming the
   argument, and outputs (filled with a sentinel) left unchanged. */
#include "capi_testing.h"

#define SENT 12345.0

enum { B = 1, L = 4, H = 2, D = 8, NX = B * L * H * D };

/* One rope_qk call that must fail naming arg; q_out and k_out keep the sentinel. */
static void rope_fails(const posenc_rope_params* p, const posenc_tensor* q, const posenc_tensor* k,
                       const posenc_tensor* pos, int64_t offset, const char* arg, double* qo, double* ko,
                       posenc_tensor* tqo, posenc_tensor* tko) {
  set_all(qo, NX, SENT);
  set_all(ko, NX, SENT);
  const int rc = posenc_rope_qk(p, q, k, pos, offset, tqo, tko, 0);
  CHECK_ERR(rc, arg);
  CHECK(all_equal(qo, NX, SENT) && all_equal(ko, NX, SENT), "%s: an output was written", arg);
}

static void rope_param_errors(posenc_rope_params* p) {
  int rc = posenc_rope_params_set(NULL, "theta", "1");
  CHECK_ERR(rc, "p");
  rc = posenc_rope_params_set(p, NULL, "1");
  CHECK_ERR(rc, "key");
  rc = posenc_rope_params_set(p, "theta", NULL);
  CHECK_ERR(rc, "theta");
  rc = posenc_rope_params_set(p, "thetaa", "1");
  CHECK_ERR(rc, "thetaa");
  rc = posenc_rope_params_set(p, "theta", "abc");
  CHECK_ERR(rc, "theta");
  rc = posenc_rope_params_set(p, "theta", "inf");
  CHECK_ERR(rc, "theta");
  rc = posenc_rope_params_set(p, "theta", " 5");  /* no leading space, as for the integers */
  CHECK_ERR(rc, "theta");
  /* control characters in a value come back as spaces: one line of text */
  rc = posenc_rope_params_set(p, "theta", "1\v2\f3\x1b[31m\x7f");
  CHECK_ERR(rc, "theta");
  int controls = 0;
  for (const char* c = posenc_last_error(); *c != '\0'; ++c) controls += (unsigned char)*c < 0x20 || *c == 0x7f;
  CHECK(controls == 0, "%d control characters in '%s'", controls, posenc_last_error());
  /* a message cut at the buffer's end ends on a whole UTF-8 character (a key of 700 'é': 1400 bytes) */
  static char key[1401];
  for (int i = 0; i < 700; ++i) key[2 * i] = (char)0xC3, key[2 * i + 1] = (char)0xA9;
  rc = posenc_rope_params_set(p, key, "1");
  CHECK_ERR(rc, "\xC3\xA9");
  const unsigned char* m = (const unsigned char*)posenc_last_error();
  size_t len = strlen((const char*)m), i = 0;
  int whole = len > 900;
  while (whole && i < len) {  /* each lead byte followed by its continuation bytes */
    const size_t n = m[i] < 0x80 ? 1 : m[i] >= 0xF0 ? 4 : m[i] >= 0xE0 ? 3 : m[i] >= 0xC0 ? 2 : 0;
    whole = n > 0 && i + n <= len;
    for (size_t j = 1; whole && j < n; ++j) whole = (m[i + j] & 0xC0) == 0x80;
    i += n;
  }
  CHECK(whole, "the cut message (%zu bytes) ends inside a UTF-8 character", len);
  rc = posenc_rope_params_set(p, "rotary_dim", "2.5");
  CHECK_ERR(rc, "rotary_dim");
  rc = posenc_rope_params_set(p, "layout", "diagonal");
  CHECK_ERR(rc, "layout");
  rc = posenc_rope_params_set(p, "rope_type", "cubic");
  CHECK_ERR(rc, "rope_type");
  rc = posenc_rope_params_set(p, "truncate", "maybe");
  CHECK_ERR(rc, "truncate");
  rc = posenc_rope_params_set(p, "freq_factors", "1,x,3");
  CHECK_ERR(rc, "freq_factors");
  int64_t hd = -1;
  rc = posenc_rope_params_from_config(p, "{\"rope_theta\": ", &hd);
  CHECK_ERR(rc, "config_json_text");
  CHECK(hd == -1, "head_dim written on error");
  rc = posenc_rope_params_from_config(p, "{\"rope_theta\": 1e4, \"head_dim\": 64, \"rope_scaling\": "
                                         "{\"rope_type\": \"llama3\", \"factor\": -2}}", &hd);
  CHECK_ERR(rc, "rope_scaling");
  rc = posenc_rope_params_from_config(p, NULL, &hd);
  CHECK_ERR(rc, "config_json_text");
}

void test_rope_errors(void) {
  static double q[NX], k[NX], qo[NX], ko[NX], ref[NX];
  static int32_t ids32[B * L];
  static float qf[NX];
  const int64_t s[4] = {B, L, H, D}, s3[3] = {B, L, H * D}, sp[1] = {L + 1}, sk[4] = {B, L + 1, H, D};
  fill(q, NX, 41);
  fill(k, NX, 42);
  posenc_rope_params* p = posenc_rope_params_new();
  rope_param_errors(p);
  /* The failed sets left p as it was: the default rotation (theta 10000, half). */
  posenc_tensor tq = tensor(q, POSENC_F64, 4, s), tk = tensor(k, POSENC_F64, 4, s);
  posenc_tensor tqo = tensor(qo, POSENC_F64, 4, s), tko = tensor(ko, POSENC_F64, 4, s);
  CHECK(posenc_rope_qk(p, &tq, NULL, NULL, 0, &tqo, NULL, 0) == POSENC_OK, "%s", posenc_last_error());
  int64_t pos[L] = {0, 1, 2, 3};
  double w[D / 2];
  rope_freqs(w, D, 10000.0);
  ref_rope(q, ref, B, L, H, D, pos, w, 1, 1.0);
  CHECK(max_abs_diff(qo, ref, NX) < 1e-12, "failed sets changed the parameters");

  rope_fails(NULL, &tq, &tk, NULL, 0, "p", qo, ko, &tqo, &tko);
  rope_fails(p, NULL, &tk, NULL, 0, "q", qo, ko, &tqo, &tko);
  rope_fails(p, &tq, &tk, NULL, 0, "q_out", qo, ko, NULL, &tko);
  rope_fails(p, &tq, &tk, NULL, 0, "k_out", qo, ko, &tqo, NULL);
  posenc_tensor bad = tensor(q, POSENC_F64, 3, s3);
  rope_fails(p, &bad, &tk, NULL, 0, "q", qo, ko, &tqo, &tko);
  bad = tensor(q, 9, 4, s);
  rope_fails(p, &bad, &tk, NULL, 0, "q", qo, ko, &tqo, &tko);
  bad = tensor(q, POSENC_I64, 4, s);
  rope_fails(p, &bad, &tk, NULL, 0, "q", qo, ko, &tqo, &tko);
  bad = tensor(qf, POSENC_F32, 4, s); /* q float32, q_out float64 */
  rope_fails(p, &bad, &tk, NULL, 0, "q_out", qo, ko, &tqo, &tko);
  bad = tensor(k, POSENC_F64, 4, sk); /* k with L + 1 tokens */
  rope_fails(p, &tq, &bad, NULL, 0, "k", qo, ko, &tqo, &tko);
  bad = tensor(q, POSENC_F64, 4, s);
  bad.strides[1] = -16;
  rope_fails(p, &bad, &tk, NULL, 0, "q", qo, ko, &tqo, &tko);
  bad = tensor(q, POSENC_F64, 4, s);
  bad.data = NULL;
  rope_fails(p, &bad, &tk, NULL, 0, "q", qo, ko, &tqo, &tko);
  bad = tensor(qo, POSENC_F64, 4, s);
  bad.strides[1] = 0; /* an output whose tokens share memory */
  rope_fails(p, &tq, &tk, NULL, 0, "q_out", qo, ko, &bad, &tko);
  posenc_tensor tpos = tensor(ids32, POSENC_I32, 1, sp); /* L + 1 positions */
  rope_fails(p, &tq, &tk, &tpos, 0, "positions", qo, ko, &tqo, &tko);
  tpos = tensor(q, POSENC_F64, 1, sp);
  tpos.shape[0] = L;
  rope_fails(p, &tq, &tk, &tpos, 0, "positions", qo, ko, &tqo, &tko);
  rope_fails(p, &tq, &tk, NULL, (int64_t)1 << 53, "positions", qo, ko, &tqo, &tko);
  posenc_rope_params_set(p, "rotary_dim", "6");
  posenc_rope_params_set(p, "layout", "half");
  posenc_rope_params_set(p, "rotary_dim", "7");
  rope_fails(p, &tq, &tk, NULL, 0, "rotary_dim", qo, ko, &tqo, &tko);
  posenc_rope_params_set(p, "rotary_dim", "0");
  posenc_rope_params_set(p, "beta_fast", "16"); /* a yarn field with rope_type default */
  rope_fails(p, &tq, &tk, NULL, 0, "beta_fast", qo, ko, &tqo, &tko);
  posenc_rope_params_free(p);
  posenc_rope_params_free(NULL);
}

enum { M = 3, N = 4, HQ = 4, HKV = 2, AD = 4, NQ = B * M * HQ * AD, NK = B * N * HKV * AD };

/* One forward that must fail naming arg; out and lse keep the sentinel. */
static void forward_fails(const posenc_attention_params* p, const posenc_tensor* q, const posenc_tensor* k,
                          const posenc_tensor* v, const posenc_tensor* out, const posenc_tensor* lse,
                          const char* arg, double* ob, double* lb) {
  set_all(ob, NQ, SENT);
  set_all(lb, B * HQ * M, SENT);
  const int rc = posenc_attention_forward(p, q, k, v, out, lse);
  CHECK_ERR(rc, arg);
  CHECK(all_equal(ob, NQ, SENT) && all_equal(lb, B * HQ * M, SENT), "%s: an output was written", arg);
}

static void params_errors(void) {
  posenc_attention_params* p = posenc_attention_params_new("no_such_encoding");
  CHECK(p == NULL, "unknown encoding accepted");
  CHECK_ERR(POSENC_ERR_INVALID, "no_such_encoding");
  CHECK(posenc_attention_params_new("sinusoidal") == NULL, "an absolute encoding accepted");
  CHECK_ERR(POSENC_ERR_INVALID, "encoding");
  CHECK(posenc_attention_params_new(NULL) == NULL, "NULL encoding accepted");
  CHECK_ERR(POSENC_ERR_INVALID, "encoding");
  p = posenc_attention_params_new("alibi");
  int rc = posenc_attention_params_set(p, "num_buckets", "8"); /* t5's key */
  CHECK_ERR(rc, "num_buckets");
  rc = posenc_attention_params_set(p, "causal", "maybe");
  CHECK_ERR(rc, "causal");
  rc = posenc_attention_params_set(p, "variant", "quadratic");
  CHECK_ERR(rc, "variant");
  rc = posenc_attention_params_set(p, "q_offset", "1.5");
  CHECK_ERR(rc, "q_offset");
  rc = posenc_attention_params_set(NULL, "causal", "true");
  CHECK_ERR(rc, "p");
  double w[8] = {0};
  const int64_t s1[1] = {HQ};
  posenc_tensor tw = tensor(w, POSENC_F64, 1, s1);
  rc = posenc_attention_set_tensor(p, "table", &tw);
  CHECK_ERR(rc, "table");
  rc = posenc_attention_set_grad(p, "slopes", &tw); /* not learned: no gradient */
  CHECK_ERR(rc, "slopes");
  rc = posenc_attention_set_tensor(p, NULL, &tw);
  CHECK_ERR(rc, "name");
  tw.dtype = -1;
  rc = posenc_attention_set_tensor(p, "slopes", &tw);
  CHECK_ERR(rc, "slopes");
  posenc_rope_params* rp = posenc_rope_params_new();
  rc = posenc_attention_set_rope(p, rp);
  CHECK_ERR(rc, "rope");
  posenc_rope_params_free(rp);
  posenc_attention_params_free(p);
  p = posenc_attention_params_new("rope");
  rc = posenc_attention_params_set(p, "theta", "-"); /* rope's own keys are checked too */
  CHECK_ERR(rc, "theta");
  posenc_attention_params_free(p);
}

void test_attention_errors(void) {
  static double q[NQ], k[NK], v[NK], out[NQ], lse[B * HQ * M], w[16 * HQ], dw[16 * HQ], dq[NQ];
  const int64_t sq[4] = {B, M, HQ, AD}, sk[4] = {B, N, HKV, AD}, sl[3] = {B, HQ, M}, sk3[4] = {B, N, 3, AD};
  const int64_t sw[2] = {16, HQ}, sw_bad[2] = {15, HQ};
  fill(q, NQ, 51);
  fill(k, NK, 52);
  fill(v, NK, 53);
  params_errors();
  posenc_attention_params* p = posenc_attention_params_new("t5");
  posenc_attention_params_set(p, "num_buckets", "16");
  posenc_tensor tq = tensor(q, POSENC_F64, 4, sq), tk = tensor(k, POSENC_F64, 4, sk), tv = tensor(v, POSENC_F64, 4, sk);
  posenc_tensor to = tensor(out, POSENC_F64, 4, sq), tl = tensor(lse, POSENC_F64, 3, sl);
  forward_fails(p, &tq, &tk, &tv, &to, &tl, "weights", out, lse); /* t5 needs its weights */
  posenc_tensor tw = tensor(w, POSENC_F64, 2, sw_bad);
  posenc_attention_set_tensor(p, "weights", &tw);
  forward_fails(p, &tq, &tk, &tv, &to, &tl, "weights", out, lse);
  tw = tensor(w, POSENC_F64, 2, sw);
  posenc_attention_set_tensor(p, "weights", &tw);
  forward_fails(NULL, &tq, &tk, &tv, &to, &tl, "p", out, lse);
  forward_fails(p, &tq, NULL, &tv, &to, &tl, "k", out, lse);
  forward_fails(p, &tq, &tk, &tv, NULL, &tl, "out", out, lse);
  posenc_tensor bad = tensor(k, POSENC_F64, 3, sk);
  forward_fails(p, &tq, &bad, &tv, &to, &tl, "k: expected 4 dimensions", out, lse);
  bad = tensor(k, POSENC_F64, 4, sk3); /* Hq = 4 not a multiple of 3 */
  forward_fails(p, &tq, &bad, &tv, &to, &tl, "k", out, lse);
  bad = tensor(v, POSENC_F32, 4, sk);
  forward_fails(p, &tq, &tk, &bad, &to, &tl, "v", out, lse);
  bad = tensor(out, POSENC_F64, 4, sk);
  forward_fails(p, &tq, &tk, &tv, &bad, &tl, "out", out, lse);
  bad = tensor(lse, POSENC_F32, 3, sl);
  forward_fails(p, &tq, &tk, &tv, &to, &bad, "lse", out, lse);
  bad = tensor(q, POSENC_F64, 4, sq);
  bad.strides[3] = -1;
  forward_fails(p, &tq, &bad, &tv, &to, &tl, "k", out, lse);
  posenc_attention_params_set(p, "scale", "0"); /* refused by the C++ side at the call */
  forward_fails(p, &tq, &tk, &tv, &to, &tl, "scale", out, lse);
  posenc_attention_params_set(p, "scale", "0.5");
  w[3] = NAN;
  forward_fails(p, &tq, &tk, &tv, &to, &tl, "weights", out, lse);
  w[3] = 0;
  /* backward: a gradient of the wrong shape, dq of the wrong shape; nothing written. */
  posenc_tensor tdw = tensor(dw, POSENC_F64, 2, sw_bad), tdq = tensor(dq, POSENC_F64, 4, sk);
  posenc_tensor tdo = tensor(out, POSENC_F64, 4, sq), tdq_ok = tensor(dq, POSENC_F64, 4, sq);
  set_all(out, NQ, 0.5);
  posenc_attention_set_grad(p, "weights", &tdw);
  set_all(dw, 16 * HQ, SENT);
  set_all(dq, NQ, SENT);
  int rc = posenc_attention_backward(p, &tq, &tk, &tv, &tdo, &tdq_ok, NULL, NULL);
  CHECK_ERR(rc, "dweights");
  CHECK(all_equal(dw, 16 * HQ, SENT) && all_equal(dq, NQ, SENT), "backward wrote on error");
  tdw = tensor(dw, POSENC_F64, 2, sw);
  posenc_attention_set_grad(p, "weights", &tdw);
  rc = posenc_attention_backward(p, &tq, &tk, &tv, &tdo, &tdq, NULL, NULL);
  CHECK_ERR(rc, "dq");
  CHECK(all_equal(dw, 16 * HQ, SENT) && all_equal(dq, NQ, SENT), "backward wrote on error");
  rc = posenc_attention_backward(p, &tq, &tk, &tv, NULL, &tdq_ok, NULL, NULL);
  CHECK_ERR(rc, "dout");
  CHECK(all_equal(dw, 16 * HQ, SENT) && all_equal(dq, NQ, SENT), "backward wrote on error");
  rc = posenc_attention_backward(p, &tq, &tk, &tv, &tdo, &tdq_ok, NULL, NULL);
  CHECK(rc == POSENC_OK && !all_equal(dq, NQ, SENT), "backward after the errors: %s", posenc_last_error());
  posenc_attention_params_free(p);
  /* A gradient the configuration does not produce (symmetric ALiBi has no weights). */
  p = posenc_attention_params_new("alibi");
  const int64_t sa[2] = {2, HQ};
  tdw = tensor(dw, POSENC_F64, 2, sa);
  CHECK(posenc_attention_set_grad(p, "weights", &tdw) == POSENC_OK, "%s", posenc_last_error());
  set_all(dq, NQ, SENT);
  set_all(dw, 2 * HQ, SENT);
  rc = posenc_attention_backward(p, &tq, &tk, &tv, &tdo, &tdq_ok, NULL, NULL);
  CHECK_ERR(rc, "dweights");
  CHECK(all_equal(dw, 2 * HQ, SENT) && all_equal(dq, NQ, SENT), "backward wrote on error");
  posenc_attention_params_free(p);
  posenc_attention_params_free(NULL);
}
