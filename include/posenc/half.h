// posenc/half.h — bfloat16 and float16 (IEEE binary16), storage only: widened to float32 (or double)
// before any math and rounded back once, to nearest-even, when stored.
#pragma once

#include <cstdint>
#include <cstring>

namespace posenc {

struct bf16 { std::uint16_t bits; };
struct f16 { std::uint16_t bits; };

// Exact widening of a bfloat16 to float32.
inline float to_float(bf16 v) {
  const std::uint32_t u = static_cast<std::uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even; NaN stays NaN (quiet).
inline bf16 to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}

// Exact widening of a float16 to float32.
inline float to_float(f16 v) {
  _Float16 h;
  std::memcpy(&h, &v.bits, 2);
  return static_cast<float>(h);
}

// Round to nearest, ties to even (overflow gives ±inf); NaN stays NaN.
inline f16 to_f16(float f) {
  const _Float16 h = static_cast<_Float16>(f);  // IEEE round to nearest even
  f16 v;
  std::memcpy(&v.bits, &h, 2);
  return v;
}

}  // namespace posenc
