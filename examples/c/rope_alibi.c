/* RoPE (theta 500000, half layout) on q and k, then causal ALiBi attention, through the C ABI. */
#include <posenc/c_api.h>
#include <stdio.h>

enum { B = 1, L = 8, H = 4, D = 64, N = B * L * H * D };

static float q[N], k[N], v[N], out[N];

static posenc_tensor view(float* data) {
  posenc_tensor t = {data, POSENC_F32, 4, {B, L, H, D}, {L * H * D, H * D, D, 1}};
  return t;
}

static double sum(const float* x) {
  double s = 0;
  for (int i = 0; i < N; ++i) s += x[i];
  return s;
}

int main(void) {
  for (int i = 0; i < N; ++i) q[i] = (float)(i % 7) / 7, k[i] = (float)(i % 5) / 5, v[i] = (float)(i % 3);
  posenc_tensor tq = view(q), tk = view(k), tv = view(v), to = view(out);
  posenc_rope_params* rope = posenc_rope_params_new();
  posenc_attention_params* alibi = posenc_attention_params_new("alibi");
  int rc = !rope || !alibi || posenc_rope_params_set(rope, "theta", "500000") ||
           posenc_rope_params_set(rope, "layout", "half") ||
           posenc_rope_qk(rope, &tq, &tk, NULL, 0, &tq, &tk, 0) ||  /* in place, positions 0..L-1 */
           posenc_attention_params_set(alibi, "causal", "true") ||
           posenc_attention_forward(alibi, &tq, &tk, &tv, &to, NULL);
  if (rc) fprintf(stderr, "posenc: %s\n", posenc_last_error());
  else printf("q %.6f\nk %.6f\nout %.6f\n", sum(q), sum(k), sum(out));
  posenc_rope_params_free(rope);
  posenc_attention_params_free(alibi);
  return rc ? 1 : 0;
}
