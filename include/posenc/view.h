// posenc/view.h — non-owning tensor views (data, dtype, shape, strides in elements) and positions.
// Layouts and position conventions shared by every entry point: docs/attention.md (Views, …).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "posenc/status.h"

namespace posenc {

// Floating storage: float32, float64, and the 16-bit storage types bfloat16 and float16 (see half.h).
enum class DType : std::uint8_t { kF32, kF64, kI32, kI64, kBF16, kF16 };

const char* dtype_name(DType t);  // "float32", "float64", "int32", "int64", "bfloat16", "float16"
std::size_t dtype_size(DType t);         // bytes per element
inline bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
}
inline bool is_int(DType t) { return t == DType::kI32 || t == DType::kI64; }

constexpr int kMaxDims = 6;

// A view of caller-owned memory, kept alive by the caller during a call; a default View (null data)
// means "absent" for an optional argument.
struct View {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{};
  std::array<std::int64_t, kMaxDims> strides{};  // in elements

  // A C-order (row-major, contiguous) view of `data`.
  static View contiguous(const void* data, DType dtype, std::initializer_list<std::int64_t> shape);
  static View contiguous(const void* data, DType dtype, const std::vector<std::int64_t>& shape);

  bool present() const { return data != nullptr; }  // false: an absent optional argument
  std::int64_t dim(int i) const { return shape[static_cast<std::size_t>(i)]; }  // shape[i]
  std::int64_t numel() const;      // the product of the shape (1 for ndim 0)
  bool is_contiguous() const;      // C-order strides (dimensions of size 1 aside)
  std::string shape_str() const;  // "[2, 3, 4]"
  std::vector<std::int64_t> shape_vec() const { return {shape.begin(), shape.begin() + ndim}; }

  // Element access by flat C-order index (slow; for references, tests and I/O).
  double get(std::int64_t flat) const;
  void set(std::int64_t flat, double value) const;
  std::int64_t get_int(std::int64_t flat) const;
  std::int64_t offset_of(std::int64_t flat) const;  // element offset of a C-order index
};

// ---- validation helpers: each returns a Status naming `arg` --------------------------------------
// Require a present float view with exactly `ndim` dimensions, within require_size's limits.
Status require_float(const char* arg, const View& v, int ndim);
// Require at most 2^40 elements (a broadcast dimension counted in full) and strides whose reach
// stays within 2^63 bytes (Code::kOutOfRange).
Status require_size(const char* arg, const View& v);
// An output: require_float, and no two of its elements at one address that the strides make certain
// (a stride of 0, or two strides of one size, on dimensions of more than one element).
Status require_output(const char* arg, const View& v, int ndim);
// Require the shape to equal `want`; entries < 0 match anything.
Status require_shape(const char* arg, const View& v, std::initializer_list<std::int64_t> want);
// Require two views to hold the same dtype (outputs keep the input's dtype).
Status require_same_dtype(const char* arg, const View& v, const View& ref, const char* ref_arg);
// Require every element to be finite (no NaN, no ±inf); the error gives the first bad value and its
// index. A scan of the whole view: meant for parameter tensors, not for activations.
Status require_finite(const char* arg, const View& v);

// ---- copies between views and contiguous double buffers (the reference works on the latter) -----
std::vector<double> to_doubles(const View& v);
void from_doubles(const std::vector<double>& src, const View& dst);

// The largest |position| any encoding accepts: 2^53, below which every integer is exact in double
// (angles m·ω and distances are formed in double) and offset + l cannot overflow.
constexpr std::int64_t kMaxPosition = std::int64_t{1} << 53;

// Positions for L tokens of a batch of B: explicit ids ([L] or [B, L], int32/int64) or an offset.
struct Positions {
  View ids;                 // absent: token l sits at offset + l
  std::int64_t offset = 0;
};
// Expands positions to a [B, L] table, validating shape and dtype (arg names the ids argument).
// Every position is bounded by kMaxPosition: ids + offset in [0, 2^53]; without ids, |offset| and
// |offset + L − 1| ≤ 2^53 (an offset may be negative there, as attention's q_offset). A position out
// of range is Code::kOutOfRange naming arg.
Expected<std::vector<std::int64_t>> expand_positions(const char* arg, const Positions& p,
                                                     std::int64_t B, std::int64_t L);
// The same for `axes` components per token: ids [axes, L] or [B, axes, L] (int32/int64, every value
// + offset in [0, 2^53]), expanded to [B, axes, L]; absent ids give offset + l in every component.
Expected<std::vector<std::int64_t>> expand_positions_axes(const char* arg, const Positions& p, int axes,
                                                          std::int64_t B, std::int64_t L);

}  // namespace posenc
