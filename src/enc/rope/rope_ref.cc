// The plain reference of rotary position embedding (scalar, double accumulation).
//
// For a token at position m, pair k = (a, b) of the first r = rotary_dim dimensions is rotated by
// the angle m·θ_k, θ_k = theta^(−2k/r), k = 0 .. r/2 − 1:
//
//   x'_a = x_a·cos(mθ_k) − x_b·sin(mθ_k)
//   x'_b = x_a·sin(mθ_k) + x_b·cos(mθ_k)          dimensions r .. D−1 pass through
//
//   layout interleaved: (a, b) = (2k, 2k+1);  layout half: (a, b) = (k, k + r/2)
//   backward: the rotation by −m·θ_k (R(m) is orthogonal, so R(m)ᵀ = R(−m)).
//
// Source: Su et al. 2021, RoFormer (arXiv 2104.09864), eq. 34 (the block-diagonal R_{Θ,m}, seed 000)
// and eq. 35 (the element-wise form, seed 002); Llama's complex form (seed 002); the half layout is
// GPT-NeoX / Hugging Face's rotate_half. The formula is written once in rope_math.h.
//
// x, y: [B, L, H, D]; the angle is formed in double from the integer position.
#include <cmath>
#include <sstream>

#include "enc/rope/rope_math.h"
#include "core/format.h"
#include "posenc/reference.h"
#include "posenc/rope.h"
#include "enc/rope/rope_check.h"

namespace posenc {
namespace rope {
// Validates (in, out, p) and returns the rotary dimension r (shared with the fast path, rope_cpu.cc).
Expected<std::int64_t> check(const RopeParams& p, const char* in_arg, const View& in, const char* out_arg,
                             const View& out) {
  POSENC_RETURN_IF_ERROR(require_float(in_arg, in, 4));
  POSENC_RETURN_IF_ERROR(require_float(out_arg, out, 4));
  POSENC_RETURN_IF_ERROR(require_shape(out_arg, out, {in.dim(0), in.dim(1), in.dim(2), in.dim(3)}));
  POSENC_RETURN_IF_ERROR(require_same_dtype(out_arg, out, in, in_arg));
  if (p.layout != RopeLayout::kInterleaved && p.layout != RopeLayout::kHalf)
    return Status::Invalid("layout", "expected interleaved or half, got value " +
                                         std::to_string(static_cast<int>(p.layout)));
  const std::int64_t D = in.dim(3);
  const std::int64_t r = p.rotary_dim == 0 ? D : p.rotary_dim;
  if (r <= 0 || r % 2 != 0 || r > D) {
    std::string what = "expected an even number in [2, D = " + std::to_string(D) + "] (0 means D), got " +
                       std::to_string(p.rotary_dim);
    if (p.rotary_dim == 0) what += " (D = " + std::to_string(D) + ")";
    return Status::Invalid("rotary_dim", what);
  }
  if (!std::isfinite(p.theta) || !(p.theta > 0))
    return Status::Invalid("theta", "expected a finite number > 0, got " + format_number(p.theta));
  return r;
}
}  // namespace rope

namespace {

// out = R(sign·m) in, token by token; sign = +1 forward, −1 backward.
Status rotate(const RopeParams& p, const char* in_arg, const View& in, const Positions& pos,
              const char* out_arg, const View& out, double sign) {
  auto rr = rope::check(p, in_arg, in, out_arg, out);
  if (!rr.ok()) return rr.status();
  const std::int64_t r = *rr;
  const std::int64_t B = in.dim(0), L = in.dim(1), H = in.dim(2), D = in.dim(3);
  auto ids = expand_positions("positions", pos, B, L);  // [B, L]
  if (!ids.ok()) return ids.status();

  std::vector<double> v = to_doubles(in);  // [B, L, H, D]; read in full before out (may alias in)
  std::vector<double> c(static_cast<std::size_t>(r / 2)), s(static_cast<std::size_t>(r / 2));
  for (std::int64_t t = 0; t < B * L; ++t) {
    const std::int64_t m = (*ids)[static_cast<std::size_t>(t)];
    for (std::int64_t k = 0; k < r / 2; ++k) {
      const double angle = sign * rope::angle(m, k, r, p.theta);
      c[static_cast<std::size_t>(k)] = std::cos(angle);
      s[static_cast<std::size_t>(k)] = std::sin(angle);
    }
    for (std::int64_t h = 0; h < H; ++h) {
      double* row = v.data() + (t * H + h) * D;  // [D]
      for (std::int64_t k = 0; k < r / 2; ++k) {
        std::int64_t a = 0, b = 0;
        rope::pair(p.layout, k, r, &a, &b);
        const double xa = row[a], xb = row[b];
        const double ck = c[static_cast<std::size_t>(k)], sk = s[static_cast<std::size_t>(k)];
        row[a] = xa * ck - xb * sk;
        row[b] = xa * sk + xb * ck;
      }
    }
  }
  from_doubles(v, out);
  return Status::Ok();
}

}  // namespace

const char* rope_layout_name(RopeLayout l) { return l == RopeLayout::kHalf ? "half" : "interleaved"; }

Expected<RopeLayout> parse_rope_layout(const std::string& s) {
  if (s == "interleaved") return RopeLayout::kInterleaved;
  if (s == "half") return RopeLayout::kHalf;
  return Status::Invalid("layout", "expected interleaved or half, got '" + s + "'");
}

namespace reference {

Status rope_forward(const RopeParams& p, const View& x, const Positions& pos, const View& y) {
  return rotate(p, "x", x, pos, "y", y, +1.0);
}

Status rope_backward(const RopeParams& p, const View& dy, const Positions& pos, const View& dx) {
  return rotate(p, "dy", dy, pos, "dx", dx, -1.0);
}

}  // namespace reference

}  // namespace posenc
