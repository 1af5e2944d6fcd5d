// A test tensor stored in one dtype (float32, bfloat16, float16 or float64) beside its stored values
// as exact doubles: what a kernel reads, and the float64 reference's copy of the very same numbers.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "posenc/half.h"
#include "posenc/view.h"

namespace posenc::testing {

struct TypedTensor {
  DType dtype;
  std::vector<float> f;
  std::vector<bf16> h;
  std::vector<f16> hf;
  std::vector<double> d;  // the stored values, exactly (float64: the storage itself)
  std::vector<std::int64_t> shape;

  // src rounded once to dtype.
  TypedTensor(DType t, const std::vector<double>& src, std::vector<std::int64_t> s)
      : dtype(t), d(src.size()), shape(std::move(s)) {
    if (t == DType::kF32) f.resize(src.size());
    if (t == DType::kBF16) h.resize(src.size());
    if (t == DType::kF16) hf.resize(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) set(i, src[i]);
  }
  // Zeros.
  TypedTensor(DType t, std::vector<std::int64_t> s) : TypedTensor(t, std::vector<double>(count(s), 0.0), s) {}

  static std::size_t count(const std::vector<std::int64_t>& s) {
    std::size_t n = 1;
    for (std::int64_t x : s) n *= static_cast<std::size_t>(x);
    return n;
  }
  // Element `at` (row-major) = x rounded once to dtype.
  void set(std::size_t at, double x) {
    const float v = static_cast<float>(x);
    switch (dtype) {
      case DType::kF32: d[at] = f[at] = v; break;
      case DType::kBF16: d[at] = to_float(h[at] = to_bf16(v)); break;
      case DType::kF16: d[at] = to_float(hf[at] = to_f16(v)); break;
      default: d[at] = x; break;
    }
  }
  // The stored tensor, for the kernel to read or write.
  View view() {
    void* p = dtype == DType::kF32    ? static_cast<void*>(f.data())
              : dtype == DType::kBF16 ? static_cast<void*>(h.data())
              : dtype == DType::kF16  ? static_cast<void*>(hf.data())
                                      : static_cast<void*>(d.data());
    return View::contiguous(p, dtype, shape);
  }
  // The float64 copy, for the reference.
  View view64() { return View::contiguous(d.data(), DType::kF64, shape); }
  // What the stored tensor holds now (after a kernel wrote it), as doubles.
  std::vector<double> values() const {
    if (dtype == DType::kF64) return d;
    std::vector<double> r(d.size());
    for (std::size_t i = 0; i < r.size(); ++i)
      r[i] = dtype == DType::kF32 ? f[i] : dtype == DType::kBF16 ? to_float(h[i]) : to_float(hf[i]);
    return r;
  }
};

}  // namespace posenc::testing
