// Validation shared by T5's reference (t5_ref.cc) and its fast dispatcher (t5_cpu.cc).
#pragma once

#include "posenc/bias.h"

namespace posenc::t5 {
// weights: a float [num_buckets, H].
Status check_weights(const char* arg, const View& w, const T5Params& p, std::int64_t H);
}  // namespace posenc::t5
