// Runs of bfloat16 / float16 widened to float32 and float32 rounded to them with the CPU's vector
// conversions (Highway, best target per call): what the fused attention's tile loads and stores use.
#pragma once

#include <cstdint>

#include "posenc/half.h"

namespace posenc::fast {

// dst[i] = src[i] for i < n, exactly (as posenc::to_float).
void widen(const bf16* src, float* dst, std::int64_t n);
void widen(const f16* src, float* dst, std::int64_t n);
// dst[i] = src[i] rounded to nearest even (as posenc::to_bf16 / to_f16; NaN stays NaN).
void narrow(const float* src, bf16* dst, std::int64_t n);
void narrow(const float* src, f16* dst, std::int64_t n);

}  // namespace posenc::fast
