// The plain reference of xPos (rotary.h): scalar, double. RoPE's rotation of pair k by m·ω_k (rope.h's
// scheme and angle mode) scaled by a·ρ_k, ρ_k = ζ_k^(±(m − c)/scale_base) (+ queries, − keys;
// xpos_math.h), through the call's rotary::Plan (rotary_plan.cc, which holds the shared rotation
// loop); the backward is the transpose a·ρ_k·R(−m·ω_k).
//
// Source: Sun et al. 2022 (arXiv 2212.10554) and torchscale's XPOS. x, y: [B, L, H, D]; positions
// [L] or [B, L].
#include "enc/rotary/rotary_plan.h"
#include "posenc/reference.h"

namespace posenc::reference {

namespace {
Status rotate(const XposParams& p, XposRole role, const char* in_arg, const View& in, const Positions& pos,
              const char* out_arg, const View& out, int dir) {
  auto c = rotary::prepare_xpos(p, role, in_arg, in, out_arg, out, pos);
  if (!c.ok()) return c.status();
  std::vector<double> v = to_doubles(in);  // read in full before out (may alias in)
  rotary::rotate_ref(c->plan, &v, c->B, c->L, c->H, c->D, c->ids, dir, rotary::role_sign(role));
  from_doubles(v, out);
  return Status::Ok();
}
}  // namespace

Status xpos_forward(const XposParams& p, XposRole role, const View& x, const Positions& pos, const View& y) {
  return rotate(p, role, "x", x, pos, "y", y, +1);
}

Status xpos_backward(const XposParams& p, XposRole role, const View& dy, const Positions& pos, const View& dx) {
  return rotate(p, role, "dy", dy, pos, "dx", dx, -1);
}

}  // namespace posenc::reference
