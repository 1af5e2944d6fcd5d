// Private: the fused tile kernel's own SIMD helpers (beyond attention_tiles.h's Simd), Highway,
// every target compiled, the best chosen at run time (attention_fused_simd.cc).
#pragma once

#include <algorithm>

#include "attention/attention_tiles.h"

namespace posenc::attn_fast {
// This kernel's own SIMD helpers (beyond the shared Simd of attention_tiles.h).
struct Extra {
  void (*trig_rows)(const double* ang, const double* sc, I n, I half, float* c, float* s);
  void (*rot_rows)(const float* x, I xld, float* y, I n, I ld, const float* c, const float* s, I half,
                   bool interleaved, bool inverse);
  void (*add_diag)(float* S, I nq, I nk, I ld, const float* diag);
  void (*sum_diag)(const float* dS, I nq, I nk, I ld, float* diag);
  void (*affine_add)(float* y, const float* x, I n, float a, float g);  // y += a + g·x (fire)
  // fire, a tile off the diagonal whose segments lie in [lo, hi] (FireSpan, attention_fused_simd.cc)
  void (*fire_span)(float* S, I nq, I nk, I ld, const float* ps0, I base, bool before, const I* th0, I nb,
                    I lo, I hi, const float* alpha, const double* beta, const double* inv);
  void (*moments)(const float* w, const float* x, const float* z, I n, float* out3);  // Σw, Σw·x, Σw·z
};

// fire_span's cuts (the forward's FireSpan, the backward's moments alike): in a row whose key 0 sits
// at kp − qp = r0, with thresholds th, the end of the run of segment sg that starts at key j — the
// k-th of the tile's segments lo..hi (hi, …, lo before the query, lo, …, hi after it), the last
// ending at nk.
inline I fire_span_end(bool before, I r0, const I* th, I sg, I k, I lo, I hi, I j, I nk) {
  if (k == hi - lo) return nk;
  return std::clamp<I>(before ? -r0 - th[sg - 1] + 1 : th[sg] - r0, j, nk);
}

// The best target's helpers on this CPU (not cached: the tests switch targets between calls).
Extra extra();
}  // namespace posenc::attn_fast
