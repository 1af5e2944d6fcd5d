// Validation shared by KERPLE's bias reference (kerple_ref.cc), its fast dispatcher (kerple_cpu.cc)
// and the attention (attention_check.h), so that all give the same Status for the same bad input.
#pragma once

#include <string>
#include <vector>

#include "core/format.h"
#include "enc/bias/kerple/kerple_math.h"
#include "posenc/bias.h"

namespace posenc::kerple {

inline Status check_kernel(KerpleKernel k) {
  if (k != KerpleKernel::kLog && k != KerpleKernel::kPower)
    return Status::Invalid("kernel", "expected log or power, got value " + std::to_string(static_cast<int>(k)));
  return Status::Ok();
}

// r1, r2: float [H] each, every pair in the kernel's domain (r1 > 0; r2 > 0, and ≤ 2 for power).
inline Status check_params(const KerpleParams& p, const View& r1, const View& r2, std::int64_t H) {
  POSENC_RETURN_IF_ERROR(check_kernel(p.kernel));
  POSENC_RETURN_IF_ERROR(require_float("r1", r1, 1));
  POSENC_RETURN_IF_ERROR(require_shape("r1", r1, {H}));
  POSENC_RETURN_IF_ERROR(require_float("r2", r2, 1));
  POSENC_RETURN_IF_ERROR(require_shape("r2", r2, {H}));
  const std::vector<double> a = to_doubles(r1), b = to_doubles(r2);
  const bool power = p.kernel == KerpleKernel::kPower;
  for (std::size_t h = 0; h < a.size(); ++h) {
    std::string w1, w2;
    if (!in_domain(power, a[h], b[h], &w1, &w2)) {
      const bool first = !w1.empty();
      return Status::Invalid(first ? "r1" : "r2", (first ? w1 : w2) + ", got " +
                                                     format_number(first ? a[h] : b[h]) + " at head " +
                                                     std::to_string(h) +
                                                     " (KERPLE's parameters are taken as given; clamp "
                                                     "them after each optimiser step)");
    }
  }
  return Status::Ok();
}

// Every argument of kerple_bias / kerple_bias_backward, in the order the reference checks them
// (defined in kerple_ref.cc).
Status check_forward(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                     const View& out);
Status check_backward(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                      const View& dbias, const View& dr1, const View& dr2);

}  // namespace posenc::kerple
