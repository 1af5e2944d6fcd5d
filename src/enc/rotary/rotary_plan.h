// Private: what a rotary encoding does to the pairs of one call — the angle φ and the scale a·ρ of
// every (token, pair[, head]) — for RoPE (rope.h) and the encodings of rotary.h (rope2d, mrope,
// xpos). The references, the fast elementwise kernel (rope_kernels.cc) and both attentions read it, so
// each formula is written once (rope_math.h, rope2d_math.h, mrope_math.h, xpos_math.h) and the
// frequencies come from rope::frequencies (the one place RoPE's schemes are computed).
//
// Positions are expanded to [B, axes, L] (axes 1: rope, xpos; 2: rope2d; 3: mrope).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "enc/rotary/rope2d/rope2d_math.h"
#include "enc/rotary/xpos/xpos_math.h"
#include "posenc/rope.h"
#include "posenc/rotary.h"

namespace posenc::rotary {

using I = std::int64_t;

enum class Kind { kRope, kAxial, kMixed, kMrope, kXpos };

struct Plan {
  Kind kind = Kind::kRope;
  RopeLayout layout = RopeLayout::kInterleaved;
  I r = 0, half = 0;  // rotary dimensions, pairs
  int axes = 1;       // position components per token
  RopeFrequencies f;  // the ladder (axial: r/4 frequencies over a rotary dimension of r/2); not mixed
  std::vector<int> axis;  // [half] the position component pair k reads
  std::vector<I> rung;    // [half] pair k's index into f
  I heads = 0;                   // mixed: heads of freqs
  std::vector<double> mixed;     // mixed: [2, heads, half] (θˣ, θʸ)
  std::vector<double> rate;      // xpos: [half] ln ζ_k / scale_base
  I center = 0;                  // xpos: c
  double factor = 1.0;           // the attention factor a

  bool per_head() const { return kind == Kind::kMixed; }
  bool scaled() const { return kind == Kind::kXpos; }

  // Mixed: θ of position component a (0: x, 1: y), pair k, head h.
  double mixed_freq(int a, I k, I h) const { return mixed[static_cast<std::size_t>((a * heads + h) * half + k)]; }
  // φ of pair k for a token whose position components are p[0 .. axes − 1]; h: the head (mixed).
  double angle(const I* p, I k, I h) const {
    if (kind == Kind::kMixed) return rope2d::mixed_angle(p[0], p[1], mixed_freq(0, k, h), mixed_freq(1, k, h));
    return f.angle(p[axis[static_cast<std::size_t>(k)]], rung[static_cast<std::size_t>(k)]);
  }
  // a·ρ of pair k at 1D position m (p[0]); role +1 query, −1 key (xpos only).
  double scale(I m, I k, int role) const {
    if (kind != Kind::kXpos) return factor;
    return factor * xpos::rho(m, center, rate[static_cast<std::size_t>(k)], role);
  }
};

// ---- building a plan (validates the params; errors name the field) -------------------------------
// The rotary dimension of p for head dimension D: 0 means D; even, a multiple of `multiple`, ≤ D.
Expected<I> rotary_dim(const RopeParams& p, I D, I multiple);
// call_len: the call's own length (largest position component + 1); p.rope.seq_len, when set,
// replaces it (and may not be below it).
Expected<Plan> rope_plan(const RopeParams& p, I D, I call_len);
// Mixed reads freqs [2, heads, r/2] (named "freqs" in errors).
Expected<Plan> rope2d_plan(const Rope2dParams& p, I D, I call_len, const View& freqs, I heads);
Expected<Plan> mrope_plan(const MropeParams& p, I D, I call_len);
Expected<Plan> xpos_plan(const XposParams& p, I D, I call_len);

// The call's own length from expanded positions: largest value + 1 (0 for none).
I call_length(const std::vector<I>& ids);

// xPos: every a·ρ_k of the call's positions ids (any layout) must be finite and representable in
// dtype, the storage of the output it multiplies; otherwise Code::kOutOfRange naming arg, with the
// position where it overflows and the last one that fits (c + lim for keys, c − lim for queries).
Status check_xpos_scale(const Plan& pl, const std::vector<I>& ids, int role, DType dtype, const char* arg);

// Validates a [B, L, H, D] input and its output (float, same shape and dtype).
Status check_io(const char* in_arg, const View& in, const char* out_arg, const View& out);

// ---- one call's validation, shared by the references and the fast paths (identical errors) --------
struct Call {
  Plan plan;
  std::vector<I> ids;  // [B, axes, L]
  I B = 0, L = 0, H = 0, D = 0;
};
// in [B, L, H, D] → out (same shape and dtype); positions [axes, L] / [B, axes, L] ([L] / [B, L] for xpos).
Expected<Call> prepare_rope2d(const Rope2dParams& p, const char* in_arg, const View& in, const char* out_arg,
                              const View& out, const Positions& pos, const View& freqs);
Expected<Call> prepare_mrope(const MropeParams& p, const char* in_arg, const View& in, const char* out_arg,
                             const View& out, const Positions& pos);
Expected<Call> prepare_xpos(const XposParams& p, XposRole role, const char* in_arg, const View& in,
                            const char* out_arg, const View& out, const Positions& pos);
// rope2d's backward: dy, and dx and/or dfreqs (dfreqs: mixed only, with x).
Expected<Call> prepare_rope2d_backward(const Rope2dParams& p, const View& dy, const Positions& pos,
                                       const View& freqs, const View& dx, const View& x, const View& dfreqs);
inline int role_sign(XposRole r) { return r == XposRole::kKey ? -1 : 1; }

// ---- the plain reference: double, scalar ----------------------------------------------------------
// x [B, L, H, D] (contiguous doubles) := a·ρ·R(dir·φ)·x per token and pair; ids [B, axes, L]; role
// +1 query / −1 key (xpos). dir = −1 is the transpose (the backward). x's heads are heads h0 … h0 +
// H − 1 of the plan's (mixed: its per-head frequencies).
void rotate_ref(const Plan& pl, std::vector<double>* x, I B, I L, I H, I D, const std::vector<I>& ids,
                int dir, int role, I h0 = 0);
// Mixed: dfreqs [2, heads, half] += Σ over tokens of (x, y)·∂L/∂φ, from the forward's output y and
// its upstream gradient g (both [B, L, H, D] doubles).
void mixed_freq_grad_ref(const Plan& pl, const std::vector<double>& y, const std::vector<double>& g, I B, I L,
                         I H, I D, const std::vector<I>& ids, std::vector<double>* dfreqs);

}  // namespace posenc::rotary
