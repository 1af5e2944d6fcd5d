// Validation shared by the sinusoidal reference and its fast dispatcher (same Status for same input).
#pragma once

#include "posenc/absolute.h"

namespace posenc::sinusoid {
Status check_base(const SinusoidalParams& p);
Status check_even_d(const char* arg, const View& v);
// in, out: [B, L, D] of one dtype; D even.
Status check_io(const char* in_arg, const View& in, const char* out_arg, const View& out);
}  // namespace posenc::sinusoid
