// The plain reference of rotary position embedding (scalar, double accumulation).
//
// For a token at position m, pair k = (a, b) of the first r = rotary_dim dimensions is rotated by
// the angle m·ω_k and scaled by the attention factor a_f, k = 0 .. r/2 − 1:
//
//   x'_a = a_f·(x_a·cos(mω_k) − x_b·sin(mω_k))
//   x'_b = a_f·(x_a·sin(mω_k) + x_b·cos(mω_k))          dimensions r .. D−1 pass through
//
//   layout interleaved: (a, b) = (2k, 2k+1);  layout half: (a, b) = (k, k + r/2)
//   backward: a_f·R(−m) (R(m) is orthogonal, so (a_f·R(m))ᵀ = a_f·R(−m)).
//
// Source: Su et al. 2021, RoFormer (arXiv 2104.09864), eq. 34 (the block-diagonal R_{Θ,m}, as the
// article “位置编码” builds it) and eq. 35 (the element-wise form); Llama's complex form (both as
// “Position Embedding” writes them; docs/articles.md); the half layout is
// GPT-NeoX / Hugging Face's rotate_half. ω_k, the angle (accurate: double; hf: transformers' float32
// product) and a_f come from RopeFrequencies (rope_freqs.cc, the formulas in rope_math.h); cos and
// sin of that angle are taken in double.
//
// x, y: [B, L, H, D]. The call's length (dynamic, longrope) is p.seq_len or max(position) + 1.
#include <cmath>

#include "enc/rotary/rope/rope_check.h"
#include "enc/rotary/rope/rope_math.h"
#include "posenc/reference.h"
#include "posenc/rope.h"

namespace posenc {
namespace rope {
// Validates (in, out, p) and returns the rotary dimension r (shared with the fast path, rope_cpu.cc).
Expected<std::int64_t> check(const RopeParams& p, const char* in_arg, const View& in, const char* out_arg,
                             const View& out) {
  POSENC_RETURN_IF_ERROR(require_float(in_arg, in, 4));
  POSENC_RETURN_IF_ERROR(require_output(out_arg, out, 4));
  POSENC_RETURN_IF_ERROR(require_shape(out_arg, out, {in.dim(0), in.dim(1), in.dim(2), in.dim(3)}));
  POSENC_RETURN_IF_ERROR(require_same_dtype(out_arg, out, in, in_arg));
  if (p.layout != RopeLayout::kInterleaved && p.layout != RopeLayout::kHalf)
    return Status::Invalid("layout", "expected interleaved or half, got value " +
                                         std::to_string(static_cast<int>(p.layout)));
  const std::int64_t D = in.dim(3);
  const std::int64_t r = p.rotary_dim == 0 ? D : p.rotary_dim;
  if (r <= 0 || r % 2 != 0 || r > D) return rotary_dim_error(p.rotary_dim, D, 2);
  POSENC_RETURN_IF_ERROR(check_params(p, r));
  return r;
}
}  // namespace rope

namespace {

// out = a_f·R(sign·m) in, token by token; sign = +1 forward, −1 backward.
Status rotate(const RopeParams& p, const char* in_arg, const View& in, const Positions& pos,
              const char* out_arg, const View& out, double sign) {
  auto rr = rope::check(p, in_arg, in, out_arg, out);
  if (!rr.ok()) return rr.status();
  const std::int64_t r = *rr;
  const std::int64_t B = in.dim(0), L = in.dim(1), H = in.dim(2), D = in.dim(3);
  auto ids = expand_positions("positions", pos, B, L);  // [B, L]
  if (!ids.ok()) return ids.status();
  auto fr = rope::frequencies(p, r, rope::call_length(*ids));
  if (!fr.ok()) return fr.status();
  const RopeFrequencies& f = *fr;

  std::vector<double> v = to_doubles(in);  // [B, L, H, D]; read in full before out (may alias in)
  std::vector<double> c(static_cast<std::size_t>(r / 2)), s(static_cast<std::size_t>(r / 2));
  for (std::int64_t t = 0; t < B * L; ++t) {
    const std::int64_t m = (*ids)[static_cast<std::size_t>(t)];
    for (std::int64_t k = 0; k < r / 2; ++k) {
      const double angle = sign * f.angle(m, k);
      c[static_cast<std::size_t>(k)] = f.attention_factor * std::cos(angle);
      s[static_cast<std::size_t>(k)] = f.attention_factor * std::sin(angle);
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

namespace reference {

Status rope_forward(const RopeParams& p, const View& x, const Positions& pos, const View& y) {
  return rotate(p, "x", x, pos, "y", y, +1.0);
}

Status rope_backward(const RopeParams& p, const View& dy, const Positions& pos, const View& dx) {
  return rotate(p, "dy", dy, pos, "dx", dx, -1.0);
}

}  // namespace reference

}  // namespace posenc
