// M-RoPE's fast path: the public posenc::mrope_forward / mrope_backward. Validation is the
// reference's (rotary_plan.cc's prepare_mrope). float32, bfloat16 and float16 views with a
// contiguous innermost dimension run RoPE's Highway kernel (rope_kernels.cc) with the call's plan: per
// token the r/2 angles p_axis(k)·ω_k are formed in double (accurate or hf, as rope.h) and reduced
// exactly, sin/cos in float (core/simd-inl.h's bound), times the attention factor, shared by the
// token's heads; OpenMP over tokens. float64 and other views fall back to posenc::reference, as does
// a call with an angle beyond 2^47 (rope_fast::angles_ok).
#include "enc/rotary/rope/rope_fast.h"
#include "posenc/reference.h"
#include "posenc/rotary.h"

namespace posenc {

namespace {
Status rotate(const MropeParams& p, const char* in_arg, const View& in, const Positions& pos, const char* out_arg,
              const View& out, double sign) {
  auto c = rotary::prepare_mrope(p, in_arg, in, out_arg, out, pos);
  if (!c.ok()) return c.status();
  if (!rope_fast::kernel_ok(in, out) || !rope_fast::angles_ok(*c))
    return sign > 0 ? reference::mrope_forward(p, in, pos, out) : reference::mrope_backward(p, in, pos, out);
  rope_fast::run_plan(*c, in, out, sign, +1);
  return Status::Ok();
}
}  // namespace

Status mrope_forward(const MropeParams& p, const View& x, const Positions& pos, const View& y) {
  return rotate(p, "x", x, pos, "y", y, +1.0);
}

Status mrope_backward(const MropeParams& p, const View& dy, const Positions& pos, const View& dx) {
  return rotate(p, "dy", dy, pos, "dx", dx, -1.0);
}

}  // namespace posenc
