// 2D RoPE's fast path: the public posenc::rope2d_forward / rope2d_backward. Validation is the
// reference's (rotary_plan.cc's prepare_rope2d), so errors are identical. float32, bfloat16 and
// float16 views with a contiguous innermost dimension run RoPE's Highway kernel (rope_kernels.cc)
// with the call's plan: per token the r/2 angles (axial: x·ω or y·ω; mixed, per head: x·θˣ + y·θʸ) are
// formed in double and reduced exactly, sin/cos evaluated in float (core/simd-inl.h's bound), every
// SIMD target compiled, the best chosen at run time; OpenMP over tokens. Mixed's dfreqs are summed
// per thread in double (rope_fast::mixed_freq_grad) and then in thread order. float64 and other
// views fall back to posenc::reference, as does a call with an angle beyond 2^47 (rope_fast::angles_ok).
#include "core/fast_common.h"
#include "enc/rotary/rope/rope_fast.h"
#include "posenc/reference.h"
#include "posenc/rotary.h"

namespace posenc {

Status rope2d_forward(const Rope2dParams& p, const View& x, const Positions& pos, const View& freqs,
                      const View& y) {
  auto c = rotary::prepare_rope2d(p, "x", x, "y", y, pos, freqs);
  if (!c.ok()) return c.status();
  if (!rope_fast::kernel_ok(x, y) || !rope_fast::angles_ok(*c)) return reference::rope2d_forward(p, x, pos, freqs, y);
  rope_fast::run_plan(*c, x, y, +1.0, +1);
  return Status::Ok();
}

Status rope2d_backward(const Rope2dParams& p, const View& dy, const Positions& pos, const View& freqs,
                       const View& dx, const View& x, const View& dfreqs) {
  auto c = rotary::prepare_rope2d_backward(p, dy, pos, freqs, dx, x, dfreqs);
  if (!c.ok()) return c.status();
  const bool fast_dx = !dx.present() || rope_fast::kernel_ok(dy, dx);
  const bool fast_df = !dfreqs.present() ||
                       (rope_fast::kernel_ok(x, x) && rope_fast::kernel_ok(dy, dy) && x.dtype == dy.dtype &&
                        !(dx.present() && fast::partial_alias(dx, x)));
  if (!fast_dx || !fast_df || !rope_fast::angles_ok(*c)) return reference::rope2d_backward(p, dy, pos, freqs, dx, x, dfreqs);
  std::vector<double> df;
  if (dfreqs.present()) rope_fast::mixed_freq_grad(*c, x, dy, &df);  // before dx may overwrite dy
  if (dx.present()) rope_fast::run_plan(*c, dy, dx, -1.0, +1);
  if (dfreqs.present()) from_doubles(df, dfreqs);
  return Status::Ok();
}

}  // namespace posenc
