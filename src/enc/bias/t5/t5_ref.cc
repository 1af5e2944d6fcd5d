// The plain reference of T5's relative position bias (scalar, double accumulation).
//
//   out[h, i, j] = W[bucket(kp − qp), h]            W = weights: [num_buckets, H]; out: [H, M, N]
//   dW[c, h]     = Σ_{(i,j): bucket(kp − qp) = c} dbias[h, i, j]
//
// with qp = q_offset + i, kp = k_offset + j and bucket(r) (r = key − query): bidirectional, half the
// buckets for r > 0; within a direction n = |r| (unidirectional: n = max(−r, 0)); n < max_exact =
// (buckets of the direction)/2 is its own bucket, larger n fall into log-spaced buckets up to
// max_distance, beyond which all share the last bucket of the direction.
//
// Source: Raffel et al. 2020 (T5, JMLR 21(140), §2.1 "Positional embeddings"); Mesh TensorFlow's
// _relative_position_bucket, as ported to Hugging Face's T5Attention; the article “语言模型为什么需要
// 位置编码” (docs/articles.md) names T5's b_ij (A = softmax(qk + b_ij)). The bucket is written once in t5_math.h.
#include <string>

#include "enc/bias/bias_geometry.h"
#include "enc/bias/t5/t5_math.h"
#include "posenc/bias.h"
#include "posenc/reference.h"
#include "enc/bias/t5/t5_check.h"

namespace posenc {
namespace t5 {

Status check_weights(const char* arg, const View& w, const T5Params& p, std::int64_t H) {
  POSENC_RETURN_IF_ERROR(require_float(arg, w, 2));
  return require_shape(arg, w, {p.num_buckets, H});
}

}  // namespace t5

using t5::check_weights;

// Each direction needs at least one exact bucket (max_exact ≥ 1, else the log term divides by 0)
// and max_distance must lie beyond the exact buckets (else the log ratio's denominator is ≤ 0).
Status t5_validate(const T5Params& p) {
  if (p.bidirectional) {
    if (p.num_buckets < 4 || p.num_buckets % 2 != 0)
      return Status::Invalid("num_buckets", "expected an even number >= 4 when bidirectional (half per "
                                            "direction, each with an exact bucket), got " +
                                                std::to_string(p.num_buckets));
  } else if (p.num_buckets < 2) {
    return Status::Invalid("num_buckets", "expected >= 2, got " + std::to_string(p.num_buckets));
  }
  const std::int64_t per_direction = p.bidirectional ? p.num_buckets / 2 : p.num_buckets;
  const std::int64_t max_exact = per_direction / 2;
  if (p.max_distance <= max_exact)
    return Status::Invalid("max_distance", "expected > " + std::to_string(max_exact) +
                                               " (the exact buckets of a direction, num_buckets/" +
                                               (p.bidirectional ? "4" : "2") + "), got " +
                                               std::to_string(p.max_distance));
  return Status::Ok();
}

// −1 when p is invalid (see t5_validate): no bucket exists then.
std::int64_t t5_bucket(std::int64_t r, const T5Params& p) {
  if (!t5_validate(p).ok()) return -1;
  return t5::bucket(r, p.bidirectional, p.num_buckets, p.max_distance);
}

namespace reference {

static Status t5_bias_unmasked(const T5Params& p, const BiasGeometry& g, const View& weights,
                               const View& out) {
  POSENC_RETURN_IF_ERROR(t5_validate(p));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  POSENC_RETURN_IF_ERROR(check_weights("weights", weights, p, H));
  POSENC_RETURN_IF_ERROR(require_finite("weights", weights));
  POSENC_RETURN_IF_ERROR(bias::check_bias_out("out", out, g));
  POSENC_RETURN_IF_ERROR(require_same_dtype("out", out, weights, "weights"));

  const std::vector<double> w = to_doubles(weights);  // [num_buckets, H]
  std::vector<double> b(static_cast<std::size_t>(H * M * N));  // [H, M, N]
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      const std::int64_t c = t5::bucket(bias::distance(g, i, j), p.bidirectional, p.num_buckets, p.max_distance);
      for (std::int64_t h = 0; h < H; ++h)
        b[static_cast<std::size_t>((h * M + i) * N + j)] = w[static_cast<std::size_t>(c * H + h)];
    }
  from_doubles(b, out);
  return Status::Ok();
}

Status t5_bias(const T5Params& p, const BiasGeometry& g, const View& weights, const View& out) {
  return bias::causal_forward(
      g, out, [&](const BiasGeometry& open) { return t5_bias_unmasked(p, open, weights, out); });
}

static Status t5_bias_backward_unmasked(const T5Params& p, const BiasGeometry& g, const View& dbias,
                                        const View& dweights) {
  POSENC_RETURN_IF_ERROR(t5_validate(p));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  POSENC_RETURN_IF_ERROR(bias::check_bias_view("dbias", dbias, g));
  POSENC_RETURN_IF_ERROR(check_weights("dweights", dweights, p, H));
  POSENC_RETURN_IF_ERROR(require_output("dweights", dweights, dweights.ndim));
  POSENC_RETURN_IF_ERROR(require_same_dtype("dweights", dweights, dbias, "dbias"));

  const std::vector<double> db = to_doubles(dbias);  // [H, M, N]
  std::vector<double> dw(static_cast<std::size_t>(p.num_buckets * H), 0.0);  // [num_buckets, H]
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      const std::int64_t c = t5::bucket(bias::distance(g, i, j), p.bidirectional, p.num_buckets, p.max_distance);
      for (std::int64_t h = 0; h < H; ++h)
        dw[static_cast<std::size_t>(c * H + h)] += db[static_cast<std::size_t>((h * M + i) * N + j)];
    }
  from_doubles(dw, dweights);
  return Status::Ok();
}

Status t5_bias_backward(const T5Params& p, const BiasGeometry& g, const View& dbias, const View& dweights) {
  return bias::causal_backward(g, dbias, [&](const BiasGeometry& open, const View& d) {
    return t5_bias_backward_unmasked(p, open, d, dweights);
  });
}

}  // namespace reference

}  // namespace posenc
