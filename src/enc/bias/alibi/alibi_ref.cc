// The plain reference of ALiBi's logit bias (scalar, double accumulation). out, dbias: [H, M, N];
// query i sits at qp = q_offset + i, key j at kp = k_offset + j; d = |kp − qp|.
//
//   symmetric     b[h,i,j] = −m_h·d                                  slopes m: the rule for H heads
//   nonsymmetric  heads h < H/2:  b = −m_h·d for kp ≤ qp (past),   −inf for kp > qp
//                 heads h ≥ H/2:  b = −m_h·d for kp ≥ qp (future), −inf for kp < qp
//                 (the diagonal is allowed in both halves, with bias 0); slopes: the rule for H/2
//                 heads, shared by head h and head h + H/2. H must be even.
//   learned       b = −σ(w[0,h])·d for kp < qp,  −σ(w[1,h])·d for kp > qp,  0 for kp = qp
//                 ∂L/∂w[0,h] = Σ_{kp<qp} dbias[h,i,j]·(−σ'(w[0,h])·d),  σ' = σ(1 − σ); likewise w[1,h]
//                 over kp > qp.
// Caller-given slopes [H] replace the rule's for symmetric and nonsymmetric (used per head as given).
//
// Source: Press et al. 2022, "Train Short, Test Long" (arXiv 2108.12409), §3, and the authors'
// get_slopes (ofirpress/attention_with_linear_biases, issue 5); the article “Position Embedding”
// (docs/articles.md) gives the three variants (its "Symmetric", "Nonsymmetric" and "Nonsymmetric with no mask" with sigmoid-squashed learned
// slopes, slopes_left = w[0] for the past, slopes_right = w[1] for the future). The slope rule is
// written once in alibi_math.h. The bias is not divided by √d.
#include <cmath>
#include <limits>

#include "enc/bias/alibi/alibi_math.h"
#include "enc/bias/bias_geometry.h"
#include "posenc/bias.h"
#include "posenc/reference.h"
#include "enc/bias/alibi/alibi_check.h"

namespace posenc {
namespace alibi {

Status check_variant(AlibiVariant v) {
  if (v != AlibiVariant::kSymmetric && v != AlibiVariant::kNonsymmetric && v != AlibiVariant::kLearned)
    return Status::Invalid("variant", "expected symmetric, nonsymmetric or learned, got value " +
                                          std::to_string(static_cast<int>(v)));
  return Status::Ok();
}

// weights: a float [2, H].
Status check_weights(const char* arg, const View& w, std::int64_t H) {
  POSENC_RETURN_IF_ERROR(require_float(arg, w, 2));
  return require_shape(arg, w, {2, H});
}

// The per-head slopes of the symmetric and nonsymmetric variants.
Expected<std::vector<double>> head_slopes(const AlibiParams& p, const BiasGeometry& g, const View& slopes) {
  const std::int64_t H = g.heads;
  if (slopes.present()) {
    POSENC_RETURN_IF_ERROR(require_float("slopes", slopes, 1));
    POSENC_RETURN_IF_ERROR(require_shape("slopes", slopes, {H}));
    std::vector<double> m = to_doubles(slopes);
    for (std::size_t h = 0; h < m.size(); ++h)
      if (!std::isfinite(m[h]))
        return Status::Invalid("slopes", "expected finite values, got a non-finite value at head " +
                                             std::to_string(h));
    return m;
  }
  return alibi::rule_slopes(H, p.variant == AlibiVariant::kNonsymmetric);
}

}  // namespace alibi

using alibi::check_variant;
using alibi::check_weights;
using alibi::head_slopes;

const char* alibi_variant_name(AlibiVariant v) {
  switch (v) {
    case AlibiVariant::kSymmetric: return "symmetric";
    case AlibiVariant::kNonsymmetric: return "nonsymmetric";
    case AlibiVariant::kLearned: return "learned";
  }
  return "?";
}

Expected<AlibiVariant> parse_alibi_variant(const std::string& s) {
  if (s == "symmetric") return AlibiVariant::kSymmetric;
  if (s == "nonsymmetric") return AlibiVariant::kNonsymmetric;
  if (s == "learned") return AlibiVariant::kLearned;
  return Status::Invalid("variant", "expected symmetric, nonsymmetric or learned, got '" + s + "'");
}

std::vector<double> alibi_slopes(std::int64_t heads) { return alibi::slopes(heads); }

namespace reference {

static Status alibi_bias_unmasked(const AlibiParams& p, const BiasGeometry& g, const View& slopes,
                                  const View& weights, const View& out) {
  POSENC_RETURN_IF_ERROR(check_variant(p.variant));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  POSENC_RETURN_IF_ERROR(bias::check_bias_out("out", out, g));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const double kNegInf = -std::numeric_limits<double>::infinity();
  std::vector<double> b(static_cast<std::size_t>(H * M * N));  // [H, M, N]

  if (p.variant == AlibiVariant::kLearned) {
    if (slopes.present())
      return Status::Invalid("slopes", "not used by the learned variant (its slopes are σ(weights)); "
                                       "expected an absent view");
    POSENC_RETURN_IF_ERROR(check_weights("weights", weights, H));
    POSENC_RETURN_IF_ERROR(require_finite("weights", weights));
    POSENC_RETURN_IF_ERROR(require_same_dtype("out", out, weights, "weights"));
    const std::vector<double> w = to_doubles(weights);  // [2, H]
    for (std::int64_t h = 0; h < H; ++h) {
      const double past = alibi::sigmoid(w[static_cast<std::size_t>(h)]);
      const double future = alibi::sigmoid(w[static_cast<std::size_t>(H + h)]);
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
          const std::int64_t r = bias::distance(g, i, j);  // key − query
          b[static_cast<std::size_t>((h * M + i) * N + j)] = alibi::learned_bias(r, past, future);
        }
    }
    from_doubles(b, out);
    return Status::Ok();
  }

  if (weights.present())
    return Status::Invalid("weights", std::string("not used by the ") + alibi_variant_name(p.variant) +
                                          " variant; expected an absent view");
  const bool nonsym = p.variant == AlibiVariant::kNonsymmetric;
  if (nonsym && H % 2 != 0)
    return Status::Invalid("heads", "expected an even number for the nonsymmetric variant (H/2 heads look "
                                    "back, H/2 forward), got " + std::to_string(H));
  auto m = head_slopes(p, g, slopes);
  if (!m.ok()) return m.status();
  for (std::int64_t h = 0; h < H; ++h) {
    const double slope = (*m)[static_cast<std::size_t>(h)];
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        const std::int64_t r = bias::distance(g, i, j);
        const bool allowed = !nonsym || alibi::nonsymmetric_allows(h, H, r);
        b[static_cast<std::size_t>((h * M + i) * N + j)] =
            allowed ? -slope * static_cast<double>(r < 0 ? -r : r) : kNegInf;
      }
  }
  from_doubles(b, out);
  return Status::Ok();
}

Status alibi_bias(const AlibiParams& p, const BiasGeometry& g, const View& slopes, const View& weights,
                  const View& out) {
  return bias::causal_forward(
      g, out, [&](const BiasGeometry& open) { return alibi_bias_unmasked(p, open, slopes, weights, out); });
}

static Status alibi_bias_backward_unmasked(const AlibiParams& p, const BiasGeometry& g, const View& weights,
                                           const View& dbias, const View& dweights) {
  POSENC_RETURN_IF_ERROR(check_variant(p.variant));
  if (p.variant != AlibiVariant::kLearned)
    return Status::Invalid("variant", std::string("expected learned (the only variant with parameters), "
                                                  "got ") + alibi_variant_name(p.variant));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  POSENC_RETURN_IF_ERROR(check_weights("weights", weights, H));
  POSENC_RETURN_IF_ERROR(require_finite("weights", weights));
  POSENC_RETURN_IF_ERROR(bias::check_bias_view("dbias", dbias, g));
  POSENC_RETURN_IF_ERROR(require_same_dtype("dbias", dbias, weights, "weights"));
  POSENC_RETURN_IF_ERROR(check_weights("dweights", dweights, H));
  POSENC_RETURN_IF_ERROR(require_output("dweights", dweights, dweights.ndim));
  POSENC_RETURN_IF_ERROR(require_same_dtype("dweights", dweights, weights, "weights"));

  const std::vector<double> w = to_doubles(weights);  // [2, H]; read before dweights (may alias)
  const std::vector<double> db = to_doubles(dbias);   // [H, M, N]
  std::vector<double> dw(static_cast<std::size_t>(2 * H), 0.0);  // [2, H]
  for (std::int64_t h = 0; h < H; ++h) {
    double past = 0, future = 0;  // Σ dbias·d over each side
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        const std::int64_t r = bias::distance(g, i, j);
        const double gd = db[static_cast<std::size_t>((h * M + i) * N + j)];
        if (r < 0) past += gd * static_cast<double>(-r);
        if (r > 0) future += gd * static_cast<double>(r);
      }
    const double s0 = alibi::sigmoid(w[static_cast<std::size_t>(h)]);
    const double s1 = alibi::sigmoid(w[static_cast<std::size_t>(H + h)]);
    dw[static_cast<std::size_t>(h)] = -s0 * (1.0 - s0) * past;
    dw[static_cast<std::size_t>(H + h)] = -s1 * (1.0 - s1) * future;
  }
  from_doubles(dw, dweights);
  return Status::Ok();
}

Status alibi_bias_backward(const AlibiParams& p, const BiasGeometry& g, const View& weights,
                           const View& dbias, const View& dweights) {
  return bias::causal_backward(g, dbias, [&](const BiasGeometry& open, const View& d) {
    return alibi_bias_backward_unmasked(p, open, weights, d, dweights);
  });
}

}  // namespace reference

}  // namespace posenc
