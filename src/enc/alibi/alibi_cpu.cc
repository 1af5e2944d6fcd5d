// ALiBi's fast path: the public posenc::alibi_bias dispatches here (validation shared with the
// reference, alibi_check.h / bias_geometry.h, in the same order, so errors are identical). The bias
// depends only on the distance, so it is built once per head over the M+N−1 distances and each row is
// a slice copy (bias_fill.h): equal to the reference bit for bit, at memory speed. The backward (a
// reduction for the learned variant) is the reference's.
#include <cmath>
#include <limits>

#include "enc/alibi/alibi_check.h"
#include "enc/alibi/alibi_math.h"
#include "enc/alibi/bias_fill.h"
#include "enc/alibi/bias_geometry.h"
#include "posenc/reference.h"

namespace posenc {

Status alibi_bias(const AlibiParams& p, const BiasGeometry& g, const View& slopes, const View& weights,
                  const View& out) {
  POSENC_RETURN_IF_ERROR(alibi::check_variant(p.variant));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  POSENC_RETURN_IF_ERROR(bias::check_bias_view("out", out, g));
  if (!bias::fill_ok(out)) return reference::alibi_bias(p, g, slopes, weights, out);
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const std::int64_t W = M + N - 1, r_min = g.k_offset - g.q_offset - (M - 1);
  std::vector<double> lut(static_cast<std::size_t>(H * (W > 0 ? W : 0)));  // [H, W]

  if (p.variant == AlibiVariant::kLearned) {
    if (slopes.present())
      return Status::Invalid("slopes", "not used by the learned variant (its slopes are σ(weights)); "
                                       "expected an absent view");
    POSENC_RETURN_IF_ERROR(alibi::check_weights("weights", weights, H));
    POSENC_RETURN_IF_ERROR(require_same_dtype("out", out, weights, "weights"));
    if (fast::partial_alias(weights, out) || (weights.data == out.data))
      return reference::alibi_bias(p, g, slopes, weights, out);
    const std::vector<double> w = to_doubles(weights);  // [2, H]
    for (std::int64_t h = 0; h < H; ++h) {
      const double past = alibi::sigmoid(w[static_cast<std::size_t>(h)]);
      const double future = alibi::sigmoid(w[static_cast<std::size_t>(H + h)]);
      for (std::int64_t x = 0; x < W; ++x) {
        const std::int64_t r = r_min + x;  // key − query
        lut[static_cast<std::size_t>(h * W + x)] = alibi::learned_bias(r, past, future);
      }
    }
    bias::fill_from_lut(g, lut, out);
    return Status::Ok();
  }

  if (weights.present())
    return Status::Invalid("weights", std::string("not used by the ") + alibi_variant_name(p.variant) +
                                          " variant; expected an absent view");
  const bool nonsym = p.variant == AlibiVariant::kNonsymmetric;
  if (nonsym && H % 2 != 0)
    return Status::Invalid("heads", "expected an even number for the nonsymmetric variant (H/2 heads look "
                                    "back, H/2 forward), got " + std::to_string(H));
  auto m = alibi::head_slopes(p, g, slopes);
  if (!m.ok()) return m.status();
  const double kNegInf = -std::numeric_limits<double>::infinity();
  for (std::int64_t h = 0; h < H; ++h) {
    const double slope = (*m)[static_cast<std::size_t>(h)];
    for (std::int64_t x = 0; x < W; ++x) {
      const std::int64_t r = r_min + x;
      const bool allowed = !nonsym || alibi::nonsymmetric_allows(h, H, r);
      lut[static_cast<std::size_t>(h * W + x)] = allowed ? -slope * static_cast<double>(r < 0 ? -r : r) : kNegInf;
    }
  }
  bias::fill_from_lut(g, lut, out);
  return Status::Ok();
}

Status alibi_bias_backward(const AlibiParams& p, const BiasGeometry& g, const View& weights,
                           const View& dbias, const View& dweights) {
  return reference::alibi_bias_backward(p, g, weights, dbias, dweights);
}

}  // namespace posenc
