// xPos's fast path: the public posenc::xpos_forward / xpos_backward. Validation is the reference's
// (rotary_plan.cc's prepare_xpos). float32, bfloat16 and float16 views with a contiguous innermost
// dimension run RoPE's Highway kernel (rope_kernels.cc) with the call's plan: per token the r/2 angles
// m·ω_k in double (accurate or hf, as rope.h), sin/cos in float (core/simd-inl.h's bound), each
// pair's a·ρ_k = a·ζ_k^(±(m − c)/scale_base) computed in double and rounded once to float; OpenMP
// over tokens. float64 and other views fall back to posenc::reference, as does a call with an angle
// beyond 2^47 (rope_fast::angles_ok).
#include "enc/rotary/rope/rope_fast.h"
#include "posenc/reference.h"
#include "posenc/rotary.h"

namespace posenc {

namespace {
Status rotate(const XposParams& p, XposRole role, const char* in_arg, const View& in, const Positions& pos,
              const char* out_arg, const View& out, double sign) {
  auto c = rotary::prepare_xpos(p, role, in_arg, in, out_arg, out, pos);
  if (!c.ok()) return c.status();
  if (!rope_fast::kernel_ok(in, out) || !rope_fast::angles_ok(*c))
    return sign > 0 ? reference::xpos_forward(p, role, in, pos, out) : reference::xpos_backward(p, role, in, pos, out);
  rope_fast::run_plan(*c, in, out, sign, rotary::role_sign(role));
  return Status::Ok();
}
}  // namespace

Status xpos_forward(const XposParams& p, XposRole role, const View& x, const Positions& pos, const View& y) {
  return rotate(p, role, "x", x, pos, "y", y, +1.0);
}

Status xpos_backward(const XposParams& p, XposRole role, const View& dy, const Positions& pos, const View& dx) {
  return rotate(p, role, "dy", dy, pos, "dx", dx, -1.0);
}

}  // namespace posenc
