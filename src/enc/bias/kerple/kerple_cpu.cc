// KERPLE's fast path: the public posenc::kerple_bias dispatches here (validation shared with the
// reference, kerple_check.h, so errors are identical). The bias depends only on the distance: each
// head's values over the M+N−1 distances are computed once (one log or pow per distance, not per
// element) and each row is a slice copy (bias_fill.h), equal to the reference bit for bit. The
// backward sums dbias per distance (bias::diagonal_sums, Highway) and then weights the sums by the
// derivatives at each distance: the reference's sums in another order (tested against it with the
// bound of a double sum).
#include <vector>

#include "core/fast_common.h"
#include "enc/bias/bias_fill.h"
#include "enc/bias/bias_geometry.h"
#include "enc/bias/kerple/kerple_check.h"
#include "enc/bias/kerple/kerple_math.h"
#include "posenc/reference.h"

namespace posenc {

static Status kerple_bias_unmasked(const KerpleParams& p, const BiasGeometry& g, const View& r1,
                                   const View& r2, const View& out) {
  POSENC_RETURN_IF_ERROR(kerple::check_forward(p, g, r1, r2, out));
  if (!bias::fill_ok(out) || fast::partial_alias(r1, out) || fast::partial_alias(r2, out) ||
      r1.data == out.data || r2.data == out.data)
    return reference::kerple_bias(p, g, r1, r2, out);
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const std::int64_t W = M + N - 1, r_min = g.k_offset - g.query_offset() - (M - 1);
  const bool power = p.kernel == KerpleKernel::kPower;
  const std::vector<double> a = to_doubles(r1), b = to_doubles(r2);  // [H] each
  std::vector<double> lut(static_cast<std::size_t>(H * (W > 0 ? W : 0)));  // [H, W]
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t x = 0; x < W; ++x) {
      const std::int64_t r = r_min + x;  // key − query
      lut[static_cast<std::size_t>(h * W + x)] =
          kerple::bias(power, a[static_cast<std::size_t>(h)], b[static_cast<std::size_t>(h)],
                       static_cast<double>(r < 0 ? -r : r));
    }
  bias::fill_from_lut(g, lut, out);
  return Status::Ok();
}

Status kerple_bias(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                   const View& out) {
  return bias::causal_forward(
      g, out, [&](const BiasGeometry& open) { return kerple_bias_unmasked(p, open, r1, r2, out); });
}

static Status kerple_bias_backward_unmasked(const KerpleParams& p, const BiasGeometry& g, const View& r1,
                                            const View& r2, const View& dbias, const View& dr1,
                                            const View& dr2) {
  POSENC_RETURN_IF_ERROR(kerple::check_backward(p, g, r1, r2, dbias, dr1, dr2));
  if (!bias::sums_ok(dbias) || fast::partial_alias(dbias, dr1) || fast::partial_alias(dbias, dr2))
    return reference::kerple_bias_backward(p, g, r1, r2, dbias, dr1, dr2);
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const std::int64_t W = M + N - 1, r_min = g.k_offset - g.query_offset() - (M - 1);
  const bool power = p.kernel == KerpleKernel::kPower;
  const std::vector<double> a = to_doubles(r1), b = to_doubles(r2);  // read before any write
  const std::vector<double> S = bias::diagonal_sums(g, dbias);       // [H, W]
  std::vector<double> g1(static_cast<std::size_t>(H), 0.0), g2(static_cast<std::size_t>(H), 0.0);
  for (std::int64_t h = 0; h < H && M * N > 0; ++h)
    for (std::int64_t x = 0; x < W; ++x) {
      const std::int64_t r = r_min + x;
      const kerple::Term t = kerple::term(power, a[static_cast<std::size_t>(h)],
                                          b[static_cast<std::size_t>(h)], static_cast<double>(r < 0 ? -r : r));
      const double s = S[static_cast<std::size_t>(h * W + x)];
      g1[static_cast<std::size_t>(h)] += s * t.d_r1;
      g2[static_cast<std::size_t>(h)] += s * t.d_r2;
    }
  if (dr1.present()) from_doubles(g1, dr1);
  if (dr2.present()) from_doubles(g2, dr2);
  return Status::Ok();
}

Status kerple_bias_backward(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                            const View& dbias, const View& dr1, const View& dr2) {
  return bias::causal_backward(g, dbias, [&](const BiasGeometry& open, const View& d) {
    return kerple_bias_backward_unmasked(p, open, r1, r2, d, dr1, dr2);
  });
}

}  // namespace posenc
