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

#if defined(__FLT16_MAX__)  // the compiler has _Float16 (g++ ≥ 12 on x86-64)

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

#else  // the same conversions on the bits (clang < 15 on x86-64 has no _Float16)

// Exact widening of a float16 to float32.
inline float to_float(f16 v) {
  const std::uint32_t sign = static_cast<std::uint32_t>(v.bits & 0x8000u) << 16;
  const std::uint32_t exp = (v.bits >> 10) & 0x1fu, man = v.bits & 0x3ffu;
  std::uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf, NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);  // normal: bias 15 → 127
  } else {
    const float sub = static_cast<float>(man) * 0x1p-24f;  // zero, subnormal: man · 2^−24, exact
    std::memcpy(&u, &sub, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even (overflow gives ±inf); NaN stays NaN (quiet).
inline f16 to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};
  if (a >= 0x477ff000u) return f16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // ≥ 65520: ±inf
  if (a >= 0x38800000u) {  // a float16 normal: drop 13 mantissa bits, to nearest even; bias 127 → 15
    const std::uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return f16{static_cast<std::uint16_t>(sign | ((r - 0x38000000u) >> 13))};
  }
  float mag;  // a float16 subnormal or zero: round(|f| · 2^24), to nearest even (|f| · 2^24 < 1024)
  std::memcpy(&mag, &a, 4);
  const float scaled = mag * 0x1p24f;
  auto n = static_cast<std::uint32_t>(scaled);
  const float frac = scaled - static_cast<float>(n);
  if (frac > 0.5f || (frac == 0.5f && (n & 1u))) ++n;
  return f16{static_cast<std::uint16_t>(sign | n)};
}

#endif

}  // namespace posenc
