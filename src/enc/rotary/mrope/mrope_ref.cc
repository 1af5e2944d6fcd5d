// The plain reference of M-RoPE (rotary.h): scalar, double. Pair k rotates by p_axis(k)·ω_k with
// axis(k) from mrope_section (mrope_math.h: chunked as Qwen2-VL, interleaved as Qwen3-VL) and ω_k,
// the attention factor and the angle mode of rope.h's scheme, through the call's rotary::Plan
// (rotary_plan.cc, which holds the shared rotation loop); the backward is the transpose R(−φ).
//
// Source: Wang et al. 2024 (Qwen2-VL, arXiv 2409.12191); transformers' apply_multimodal_rotary_pos_emb
// and apply_interleaved_mrope. x, y: [B, L, H, D]; positions [3, L] or [B, 3, L] (t, h, w).
#include "enc/rotary/rotary_plan.h"
#include "posenc/reference.h"

namespace posenc::reference {

namespace {
Status rotate(const MropeParams& p, const char* in_arg, const View& in, const Positions& pos, const char* out_arg,
              const View& out, int dir) {
  auto c = rotary::prepare_mrope(p, in_arg, in, out_arg, out, pos);
  if (!c.ok()) return c.status();
  std::vector<double> v = to_doubles(in);  // read in full before out (may alias in)
  rotary::rotate_ref(c->plan, &v, c->B, c->L, c->H, c->D, c->ids, dir, +1);
  from_doubles(v, out);
  return Status::Ok();
}
}  // namespace

Status mrope_forward(const MropeParams& p, const View& x, const Positions& pos, const View& y) {
  return rotate(p, "x", x, pos, "y", y, +1);
}

Status mrope_backward(const MropeParams& p, const View& dy, const Positions& pos, const View& dx) {
  return rotate(p, "dy", dy, pos, "dx", dx, -1);
}

}  // namespace posenc::reference
