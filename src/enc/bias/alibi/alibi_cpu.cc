// ALiBi's fast path: the public posenc::alibi_bias dispatches here (validation shared with the
// reference, alibi_check.h / bias_geometry.h, in the same order, so errors are identical). The bias
// depends only on the distance, so it is built once per head over the M+N−1 distances and each row
// is a slice copy (bias_fill.h): equal to the reference bit for bit, at memory speed. The backward
// of the learned variant sums dbias per distance first (bias::diagonal_sums, whose Highway kernel
// lives in this file and serves T5 too), then weights the M+N−1 sums by |distance|: the reference's
// sums in another order (tested against it with the bound of a double sum).
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "posenc/bias.h"

#ifndef POSENC_DIAG_JOB_DEFINED
#define POSENC_DIAG_JOB_DEFINED
namespace posenc::diag_fast {
struct Job {
  DType dtype = DType::kF32;
  std::int64_t H = 0, M = 0, N = 0;
  const void* dbias = nullptr;  // [H, M, N]
  std::int64_t s[2] = {0, 0};   // element strides of h, i
  double* S = nullptr;          // [H, M+N−1], zeroed
  int threads = 1;
};
}  // namespace posenc::diag_fast
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "enc/bias/alibi/alibi_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/fast_common.h"
#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace {

template <typename T>
void DiagImpl(const diag_fast::Job& j) {
  const std::int64_t M = j.M, N = j.N, W = M + N - 1;
  fast::parallel_ranges(j.H, j.threads, [&](std::int64_t h0, std::int64_t h1) {
    for (std::int64_t h = h0; h < h1; ++h) {
      double* S = j.S + h * W;
      for (std::int64_t i = 0; i < M; ++i) {
        const T* row = static_cast<const T*>(j.dbias) + h * j.s[0] + i * j.s[1];
        double* acc = S + (M - 1 - i);
        std::int64_t k = 0;
#if HWY_HAVE_FLOAT64
        const hn::ScalableTag<double> dd;
        const hn::Rebind<float, decltype(dd)> dfh;
        const std::int64_t Nd = static_cast<std::int64_t>(hn::Lanes(dd));
        for (; k + Nd <= N; k += Nd)
          hn::StoreU(hn::Add(hn::LoadU(dd, acc + k), hn::PromoteTo(dd, LoadF(dfh, row + k))), dd,
                     acc + k);
#endif
        for (; k < N; ++k) acc[k] += static_cast<double>(ToF(row[k]));
      }
    }
  });
}

}  // namespace

void DiagRun(const diag_fast::Job& j) {
  switch (j.dtype) {
    case DType::kF32:
      DiagImpl<float>(j);
      break;
    case DType::kBF16:
      DiagImpl<hwy::bfloat16_t>(j);
      break;
    case DType::kF16:
      DiagImpl<hwy::float16_t>(j);
      break;
    default:
      break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "enc/bias/alibi/alibi_check.h"
#include "enc/bias/alibi/alibi_math.h"
#include "enc/bias/bias_fill.h"
#include "enc/bias/bias_geometry.h"
#include "posenc/reference.h"

namespace posenc {
HWY_EXPORT(DiagRun);

namespace bias {

std::vector<double> diagonal_sums(const BiasGeometry& g, const View& dbias) {
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len, W = M + N - 1;
  std::vector<double> S(static_cast<std::size_t>(H * (W > 0 ? W : 0)), 0.0);
  if (H * M * N == 0) return S;
  diag_fast::Job j;
  j.dtype = dbias.dtype;
  j.H = H;
  j.M = M;
  j.N = N;
  j.dbias = dbias.data;
  j.s[0] = dbias.strides[0];
  j.s[1] = dbias.strides[1];
  j.S = S.data();
  j.threads = fast::threads_for(H * M * N);
  HWY_DYNAMIC_DISPATCH(DiagRun)(j);
  return S;
}

}  // namespace bias

static Status alibi_bias_unmasked(const AlibiParams& p, const BiasGeometry& g, const View& slopes,
                                  const View& weights, const View& out) {
  POSENC_RETURN_IF_ERROR(alibi::check_variant(p.variant));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  POSENC_RETURN_IF_ERROR(bias::check_bias_out("out", out, g));
  if (!bias::fill_ok(out)) return reference::alibi_bias(p, g, slopes, weights, out);
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const std::int64_t W = M + N - 1, r_min = g.k_offset - g.query_offset() - (M - 1);
  std::vector<double> lut(static_cast<std::size_t>(H * (W > 0 ? W : 0)));  // [H, W]

  if (p.variant == AlibiVariant::kLearned) {
    if (slopes.present())
      return Status::Invalid("slopes", "not used by the learned variant (its slopes are σ(weights)); "
                                       "expected an absent view");
    POSENC_RETURN_IF_ERROR(alibi::check_weights("weights", weights, H));
    POSENC_RETURN_IF_ERROR(require_finite("weights", weights));
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

Status alibi_bias(const AlibiParams& p, const BiasGeometry& g, const View& slopes, const View& weights,
                  const View& out) {
  return bias::causal_forward(
      g, out, [&](const BiasGeometry& open) { return alibi_bias_unmasked(p, open, slopes, weights, out); });
}

static Status alibi_bias_backward_unmasked(const AlibiParams& p, const BiasGeometry& g, const View& weights,
                                           const View& dbias, const View& dweights) {
  // The reference's validation, in its order.
  POSENC_RETURN_IF_ERROR(alibi::check_variant(p.variant));
  if (p.variant != AlibiVariant::kLearned)
    return reference::alibi_bias_backward(p, g, weights, dbias, dweights);  // its error
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  POSENC_RETURN_IF_ERROR(alibi::check_weights("weights", weights, H));
  POSENC_RETURN_IF_ERROR(require_finite("weights", weights));
  POSENC_RETURN_IF_ERROR(bias::check_bias_view("dbias", dbias, g));
  POSENC_RETURN_IF_ERROR(require_same_dtype("dbias", dbias, weights, "weights"));
  POSENC_RETURN_IF_ERROR(alibi::check_weights("dweights", dweights, H));
  POSENC_RETURN_IF_ERROR(require_output("dweights", dweights, dweights.ndim));
  POSENC_RETURN_IF_ERROR(require_same_dtype("dweights", dweights, weights, "weights"));
  if (!bias::sums_ok(dbias) || fast::partial_alias(dbias, dweights))
    return reference::alibi_bias_backward(p, g, weights, dbias, dweights);

  const std::vector<double> w = to_doubles(weights);  // [2, H]; read before dweights (may alias)
  const std::vector<double> S = bias::diagonal_sums(g, dbias);  // [H, W]
  const std::int64_t W = M + N - 1, r_min = g.k_offset - g.query_offset() - (M - 1);
  std::vector<double> dw(static_cast<std::size_t>(2 * H), 0.0);  // [2, H]
  for (std::int64_t h = 0; h < H && M * N > 0; ++h) {
    double past = 0, future = 0;  // Σ dbias·|r| over each side
    for (std::int64_t x = 0; x < W; ++x) {
      const std::int64_t r = r_min + x;
      const double sum = S[static_cast<std::size_t>(h * W + x)];
      if (r < 0) past += sum * static_cast<double>(-r);
      if (r > 0) future += sum * static_cast<double>(r);
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

}  // namespace posenc
#endif  // HWY_ONCE
