// The plain reference of 2D RoPE (rotary.h): scalar, double. Axial and mixed per rope2d_math.h,
// through the call's rotary::Plan (rotary_plan.cc, which also holds the shared rotation loop):
//
//   axial: pair k < r/4 rotates by x·ω_k, pair k ≥ r/4 by y·ω_{k−r/4}, ω_j = theta^(−4j/r)
//   mixed: pair k of head h rotates by x·θˣ_{h,k} + y·θʸ_{h,k}
//   backward: the transpose R(−φ); mixed's dfreqs = Σ_tokens (x, y)·(g_b·y_a − g_a·y_b)
//
// Source: Heo et al. 2024 (RoPE-ViT, arXiv 2403.13298) and the authors' compute_axial_cis /
// compute_mixed_cis. x, y: [B, L, H, D]; positions [2, L] or [B, 2, L] (x, y); freqs [2, H, r/2].
#include "enc/rotary/rotary_plan.h"
#include "posenc/reference.h"

namespace posenc::reference {

Status rope2d_forward(const Rope2dParams& p, const View& x, const Positions& pos, const View& freqs,
                      const View& y) {
  auto c = rotary::prepare_rope2d(p, "x", x, "y", y, pos, freqs);
  if (!c.ok()) return c.status();
  std::vector<double> v = to_doubles(x);  // read in full before y (may alias x)
  rotary::rotate_ref(c->plan, &v, c->B, c->L, c->H, c->D, c->ids, +1, +1);
  from_doubles(v, y);
  return Status::Ok();
}

Status rope2d_backward(const Rope2dParams& p, const View& dy, const Positions& pos, const View& freqs,
                       const View& dx, const View& x, const View& dfreqs) {
  auto c = rotary::prepare_rope2d_backward(p, dy, pos, freqs, dx, x, dfreqs);
  if (!c.ok()) return c.status();
  std::vector<double> g = to_doubles(dy);
  std::vector<double> df;
  if (dfreqs.present()) {
    std::vector<double> y = to_doubles(x);
    rotary::rotate_ref(c->plan, &y, c->B, c->L, c->H, c->D, c->ids, +1, +1);  // the forward's output
    df.assign(static_cast<std::size_t>(2 * c->H * c->plan.half), 0.0);
    rotary::mixed_freq_grad_ref(c->plan, y, g, c->B, c->L, c->H, c->D, c->ids, &df);
  }
  if (dx.present()) {
    rotary::rotate_ref(c->plan, &g, c->B, c->L, c->H, c->D, c->ids, -1, +1);
    from_doubles(g, dx);
  }
  if (dfreqs.present()) from_doubles(df, dfreqs);
  return Status::Ok();
}

}  // namespace posenc::reference
