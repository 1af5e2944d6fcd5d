// Validation shared by the sinusoidal reference and its fast dispatcher (same Status for same input).
#pragma once

#include "posenc/absolute.h"

namespace posenc::sinusoid {
Status check_base(const SinusoidalParams& p);
// The frequencies w_i = base^(−2i/D) of an even D: each <= 2^969, so that every angle p·w_i is
// finite for |p| <= 2^53 (a base far below 1 makes them huge); an error naming base otherwise.
Status check_freqs(const SinusoidalParams& p, std::int64_t D);
// The largest w_i of D (w_0 = 1 for base >= 1, w_{D/2−1} below).
double max_freq(const SinusoidalParams& p, std::int64_t D);
Status check_even_d(const char* arg, const View& v);
// in, out: [B, L, D] of one dtype; D even.
Status check_io(const char* in_arg, const View& in, const char* out_arg, const View& out);
}  // namespace posenc::sinusoid
