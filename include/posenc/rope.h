// posenc/rope.h — rotary position embedding (Su et al. 2021, RoFormer, arXiv 2104.09864).
//
// For a token at position m, pairs of the first r = rotary_dim dimensions are rotated by m·θ_k,
// θ_k = theta^(−2k/r), k = 0 .. r/2−1; dimensions r .. D−1 pass through unchanged.
//
//   layout interleaved: pair k = (2k, 2k+1)       RoFormer eq. 34, seed 000's rotation matrix,
//                                                  seed 002's complex (Llama) and element-wise forms
//   layout half:        pair k = (k, k + r/2)      GPT-NeoX, Hugging Face Llama ("rotate_half")
//
//      x'_a = x_a·cos(mθ_k) − x_b·sin(mθ_k)
//      x'_b = x_a·sin(mθ_k) + x_b·cos(mθ_k)
//
// Angles m·θ_k are formed in double, so integer positions up to 2^24 (and far beyond) are exact to
// double rounding. Backward is the rotation by −m·θ_k (the rotation is orthogonal).
//
// x, y: [B, L, H, D], float32, float64, bfloat16 or float16 (math in float32 for the 16-bit types and
// float32, in double for float64); y has x's dtype and may alias x (in place). Outer strides are free.
// The fast path (float32/bfloat16/float16 with a contiguous last dimension) forms each angle in double
// and reduces it exactly before a float sin/cos: |error of sin, cos| ≤ 3·10⁻⁷ + |m·θ_k|·2⁻⁵¹
// (see src/core/simd-inl.h); the reference (posenc/reference.h) is double throughout.
//
//   interleaved (r = 8):  x0 x1 | x2 x3 | x4 x5 | x6 x7       pairs are neighbours
//                         k=0     k=1     k=2     k=3
//   half        (r = 8):  x0 x1 x2 x3 | x4 x5 x6 x7           pair k = (x_k, x_{k+4})
//                         k=0 1  2  3   k=0 1  2  3
#pragma once

#include "posenc/view.h"

namespace posenc {

enum class RopeLayout { kInterleaved, kHalf };

struct RopeParams {
  RopeLayout layout = RopeLayout::kInterleaved;
  std::int64_t rotary_dim = 0;  // r; 0 means the whole head dimension D. Must be even and ≤ D.
  double theta = 10000.0;
};

const char* rope_layout_name(RopeLayout l);                    // "interleaved" / "half"
Expected<RopeLayout> parse_rope_layout(const std::string& s);  // inverse of the above

Status rope_forward(const RopeParams& p, const View& x, const Positions& pos, const View& y);
Status rope_backward(const RopeParams& p, const View& dy, const Positions& pos, const View& dx);

// q and k in one call (one pass computes each token's sin/cos once for every head of both):
// q, q_out: [B, L, Hq, D]; k, k_out: [B, L, Hk, Dk] (same B, L and rotary dimension; Hk may differ,
// e.g. grouped-query attention). q_out may alias q and k_out may alias k (in place); k and k_out may
// both be absent (q only). backward = true applies R(−m) (the gradient). Errors name q, k, q_out,
// k_out, positions, rotary_dim, layout or theta.
Status rope_apply_qk(const RopeParams& p, const View& q, const View& k, const Positions& pos,
                     const View& q_out, const View& k_out, bool backward = false);

}  // namespace posenc
