// Validation shared by ALiBi's reference (alibi_ref.cc) and its fast dispatcher (alibi_cpu.cc).
#pragma once

#include <vector>

#include "posenc/bias.h"

namespace posenc::alibi {
Status check_variant(AlibiVariant v);
// weights: a float [2, H].
Status check_weights(const char* arg, const View& w, std::int64_t H);
// The per-head slopes of the symmetric and nonsymmetric variants (caller-given or the rule's).
Expected<std::vector<double>> head_slopes(const AlibiParams& p, const BiasGeometry& g, const View& slopes);
}  // namespace posenc::alibi
