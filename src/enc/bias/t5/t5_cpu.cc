// T5's fast path: the public posenc::t5_bias dispatches here (validation shared with the reference,
// in the same order, so errors are identical). The bias depends only on the distance: each head's
// values over the M+N−1 distances are looked up once (one bucket per distance, not per element) and
// each row is a slice copy (bias_fill.h), equal to the reference bit for bit. The backward sums
// dbias per distance (bias::diagonal_sums, vectorised) and then per bucket: the reference's sums in
// another order (tested against it with the bound of a double sum).
#include "enc/bias/bias_fill.h"
#include "enc/bias/bias_geometry.h"
#include "enc/bias/t5/t5_check.h"
#include "enc/bias/t5/t5_math.h"
#include "posenc/reference.h"

namespace posenc {

static Status t5_bias_unmasked(const T5Params& p, const BiasGeometry& g, const View& weights,
                               const View& out) {
  POSENC_RETURN_IF_ERROR(t5_validate(p));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  POSENC_RETURN_IF_ERROR(t5::check_weights("weights", weights, p, H));
  POSENC_RETURN_IF_ERROR(require_finite("weights", weights));
  POSENC_RETURN_IF_ERROR(bias::check_bias_out("out", out, g));
  POSENC_RETURN_IF_ERROR(require_same_dtype("out", out, weights, "weights"));
  if (!bias::fill_ok(out) || fast::partial_alias(weights, out) || weights.data == out.data)
    return reference::t5_bias(p, g, weights, out);
  const std::int64_t W = M + N - 1, r_min = g.k_offset - g.query_offset() - (M - 1);
  const std::vector<double> w = to_doubles(weights);  // [num_buckets, H]
  std::vector<double> lut(static_cast<std::size_t>(H * (W > 0 ? W : 0)));  // [H, W]
  for (std::int64_t x = 0; x < W; ++x) {
    const std::int64_t c = t5::bucket(r_min + x, p.bidirectional, p.num_buckets, p.max_distance);
    for (std::int64_t h = 0; h < H; ++h)
      lut[static_cast<std::size_t>(h * W + x)] = w[static_cast<std::size_t>(c * H + h)];
  }
  bias::fill_from_lut(g, lut, out);
  return Status::Ok();
}

Status t5_bias(const T5Params& p, const BiasGeometry& g, const View& weights, const View& out) {
  return bias::causal_forward(
      g, out, [&](const BiasGeometry& open) { return t5_bias_unmasked(p, open, weights, out); });
}

static Status t5_bias_backward_unmasked(const T5Params& p, const BiasGeometry& g, const View& dbias,
                                        const View& dweights) {
  // The reference's validation, in its order.
  POSENC_RETURN_IF_ERROR(t5_validate(p));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  POSENC_RETURN_IF_ERROR(bias::check_bias_view("dbias", dbias, g));
  POSENC_RETURN_IF_ERROR(t5::check_weights("dweights", dweights, p, H));
  POSENC_RETURN_IF_ERROR(require_output("dweights", dweights, dweights.ndim));
  POSENC_RETURN_IF_ERROR(require_same_dtype("dweights", dweights, dbias, "dbias"));
  if (!bias::sums_ok(dbias) || fast::partial_alias(dbias, dweights))
    return reference::t5_bias_backward(p, g, dbias, dweights);
  // Per distance first (one bucket per distance, not per element), then per bucket.
  const std::vector<double> S = bias::diagonal_sums(g, dbias);  // [H, W]
  const std::int64_t W = M + N - 1, r_min = g.k_offset - g.query_offset() - (M - 1);
  std::vector<double> dw(static_cast<std::size_t>(p.num_buckets * H), 0.0);  // [num_buckets, H]
  for (std::int64_t x = 0; x < W && M * N > 0; ++x) {
    const std::int64_t c = t5::bucket(r_min + x, p.bidirectional, p.num_buckets, p.max_distance);
    for (std::int64_t h = 0; h < H; ++h)
      dw[static_cast<std::size_t>(c * H + h)] += S[static_cast<std::size_t>(h * W + x)];
  }
  from_doubles(dw, dweights);
  return Status::Ok();
}

Status t5_bias_backward(const T5Params& p, const BiasGeometry& g, const View& dbias, const View& dweights) {
  return bias::causal_backward(g, dbias, [&](const BiasGeometry& open, const View& d) {
    return t5_bias_backward_unmasked(p, open, d, dweights);
  });
}

}  // namespace posenc
