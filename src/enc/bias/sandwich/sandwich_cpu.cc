// Sandwich's fast path: the public posenc::sandwich_bias dispatches here (validation in the
// reference's order, so errors are identical). The bias depends only on the distance: its
// head-independent part is computed once per distance (d̄/2 sines each, over the M+N−1 distances,
// not per element), scaled per head, and each row is a slice copy (bias_fill.h) — the same double
// expression as the reference, rounded once: equal to it bit for bit.
#include <vector>

#include "enc/bias/bias_fill.h"
#include "enc/bias/bias_geometry.h"
#include "enc/bias/sandwich/sandwich_math.h"
#include "posenc/reference.h"

namespace posenc {

static Status sandwich_bias_unmasked(const SandwichParams& p, const BiasGeometry& g, const View& out) {
  POSENC_RETURN_IF_ERROR(sandwich_validate(p));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  POSENC_RETURN_IF_ERROR(bias::check_bias_out("out", out, g));
  if (!bias::fill_ok(out)) return reference::sandwich_bias(p, g, out);
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const std::int64_t W = M + N - 1, r_min = g.k_offset - g.query_offset() - (M - 1);
  const std::vector<double> w = sandwich::freqs(p.sinusoid_dim, p.base);
  std::vector<double> base(static_cast<std::size_t>(W > 0 ? W : 0));  // per distance
  for (std::int64_t x = 0; x < W; ++x)
    base[static_cast<std::size_t>(x)] = sandwich::shifted_inner_product(static_cast<double>(r_min + x), w);
  std::vector<double> lut(static_cast<std::size_t>(H) * base.size());  // [H, W]
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t x = 0; x < W; ++x)
      lut[static_cast<std::size_t>(h * W + x)] = base[static_cast<std::size_t>(x)] * sandwich::head_scale(h, H);
  bias::fill_from_lut(g, lut, out);
  return Status::Ok();
}

Status sandwich_bias(const SandwichParams& p, const BiasGeometry& g, const View& out) {
  return bias::causal_forward(g, out,
                              [&](const BiasGeometry& open) { return sandwich_bias_unmasked(p, open, out); });
}

}  // namespace posenc
