#include "posenc/view.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "posenc/half.h"

namespace posenc {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
  }
  return "?";
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF64: case DType::kI64: return 8;
    case DType::kBF16: case DType::kF16: return 2;
  }
  return 0;
}

View View::contiguous(const void* data, DType dtype, const std::vector<std::int64_t>& shape) {
  View v;
  v.data = const_cast<void*>(data);
  v.dtype = dtype;
  v.ndim = static_cast<int>(shape.size());
  // A product beyond int64 (only an empty tensor can have one) leaves the outer strides 0.
  std::int64_t stride = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[static_cast<std::size_t>(i)];
    v.strides[i] = stride;
    if (__builtin_mul_overflow(stride, v.shape[i], &stride)) stride = 0;
  }
  return v;
}

View View::contiguous(const void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  return contiguous(data, dtype, std::vector<std::int64_t>(shape));
}

std::int64_t View::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool View::is_contiguous() const {
  std::int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != stride) return false;
    stride *= shape[i];
  }
  return true;
}

std::string View::shape_str() const {
  if (ndim < 0 || ndim > kMaxDims) return "of ndim " + std::to_string(ndim);  // no shape to read
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

std::int64_t View::offset_of(std::int64_t flat) const {
  std::int64_t off = 0;
  for (int i = ndim - 1; i >= 0; --i) {
    const std::int64_t idx = flat % shape[i];
    flat /= shape[i];
    off += idx * strides[i];
  }
  return off;
}

double View::get(std::int64_t flat) const {
  const std::int64_t o = offset_of(flat);
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[o];
    case DType::kF64: return static_cast<const double*>(data)[o];
    case DType::kI32: return static_cast<const std::int32_t*>(data)[o];
    case DType::kI64: return static_cast<double>(static_cast<const std::int64_t*>(data)[o]);
    case DType::kBF16: return to_float(static_cast<const bf16*>(data)[o]);
    case DType::kF16: return to_float(static_cast<const f16*>(data)[o]);
  }
  return 0;
}

void View::set(std::int64_t flat, double value) const {
  const std::int64_t o = offset_of(flat);
  switch (dtype) {
    case DType::kF32: static_cast<float*>(data)[o] = static_cast<float>(value); break;
    case DType::kF64: static_cast<double*>(data)[o] = value; break;
    case DType::kI32: static_cast<std::int32_t*>(data)[o] = static_cast<std::int32_t>(value); break;
    case DType::kI64: static_cast<std::int64_t*>(data)[o] = static_cast<std::int64_t>(value); break;
    case DType::kBF16: static_cast<bf16*>(data)[o] = to_bf16(static_cast<float>(value)); break;
    case DType::kF16: static_cast<f16*>(data)[o] = to_f16(static_cast<float>(value)); break;
  }
}

std::int64_t View::get_int(std::int64_t flat) const {
  const std::int64_t o = offset_of(flat);
  switch (dtype) {
    case DType::kI32: return static_cast<const std::int32_t*>(data)[o];
    case DType::kI64: return static_cast<const std::int64_t*>(data)[o];
    case DType::kF32: return static_cast<std::int64_t>(static_cast<const float*>(data)[o]);
    case DType::kF64: return static_cast<std::int64_t>(static_cast<const double*>(data)[o]);
    case DType::kBF16: case DType::kF16: return static_cast<std::int64_t>(get(flat));
  }
  return 0;
}

Status require_float(const char* arg, const View& v, int ndim) {
  if (!v.present()) return Status::Invalid(arg, "is required");
  if (!is_float(v.dtype))
    return Status::Invalid(arg, std::string("expected a floating-point dtype, got ") + dtype_name(v.dtype));
  if (v.ndim != ndim)
    return Status::Invalid(arg, "expected " + std::to_string(ndim) + " dimensions, got shape " +
                                    v.shape_str());
  for (int i = 0; i < v.ndim; ++i)
    if (v.shape[i] < 0) return Status::Invalid(arg, "negative extent in shape " + v.shape_str());
  return require_size(arg, v);
}

Status require_output(const char* arg, const View& v, int ndim) {
  POSENC_RETURN_IF_ERROR(require_float(arg, v, ndim));
  for (int i = 0; i < v.ndim; ++i) {
    if (v.shape[i] <= 1) continue;
    const std::int64_t si = v.strides[i] < 0 ? -v.strides[i] : v.strides[i];
    bool clash = si == 0;
    for (int j = 0; j < i && !clash; ++j)
      clash = v.shape[j] > 1 && (v.strides[j] < 0 ? -v.strides[j] : v.strides[j]) == si;
    if (clash)
      return Status::Invalid(arg, "expected an output whose elements have distinct addresses, got shape " +
                                      v.shape_str() + " with stride " + std::to_string(v.strides[i]) +
                                      " in dimension " + std::to_string(i) + " (another element at each address)");
  }
  return Status::Ok();
}

Status require_size(const char* arg, const View& v) {
  constexpr std::int64_t kMaxElements = std::int64_t{1} << 40;  // the C ABI's POSENC_MAX_ELEMENTS
  std::int64_t elements = 1, span = 0, bytes = 0;
  for (int i = 0; i < v.ndim; ++i) {  // a stride-0 (broadcast) dimension counts in full
    if (__builtin_mul_overflow(elements, v.shape[i], &elements) || elements > kMaxElements)
      return Status::OutOfRange(arg, "shape " + v.shape_str() + " has more than 2^40 elements");
  }
  for (int i = 0; i < v.ndim && elements > 0; ++i) {
    std::int64_t reach = 0;
    const std::int64_t stride = v.strides[i] < 0 ? -v.strides[i] : v.strides[i];
    if (v.strides[i] == INT64_MIN || __builtin_mul_overflow(v.shape[i] - 1, stride, &reach) ||
        __builtin_add_overflow(span, reach, &span))
      return Status::OutOfRange(arg, "shape and strides reach beyond 2^63 elements in dimension " + std::to_string(i));
  }
  if (__builtin_mul_overflow(span + 1, static_cast<std::int64_t>(dtype_size(v.dtype)), &bytes))
    return Status::OutOfRange(arg, "shape and strides reach beyond 2^63 bytes");
  return Status::Ok();
}

Status require_shape(const char* arg, const View& v, std::initializer_list<std::int64_t> want) {
  bool match = static_cast<int>(want.size()) == v.ndim;
  std::string ws = "[";
  int i = 0;
  for (std::int64_t w : want) {
    ws += (i ? ", " : "") + (w < 0 ? std::string("*") : std::to_string(w));
    if (match && w >= 0 && v.shape[i] != w) match = false;
    ++i;
  }
  ws += "]";
  if (!match) return Status::Invalid(arg, "expected shape " + ws + ", got " + v.shape_str());
  return Status::Ok();
}

Status require_same_dtype(const char* arg, const View& v, const View& ref, const char* ref_arg) {
  if (v.dtype != ref.dtype)
    return Status::Invalid(arg, std::string("expected ") + dtype_name(ref.dtype) + " like " + ref_arg +
                                    ", got " + dtype_name(v.dtype));
  return Status::Ok();
}

// Whether the n words x[0, n) of a float type hold only finite values: |x| + (one exponent step) sets
// the sign bit exactly for inf and NaN; eight independent ORs (vectorized, else eight chains).
template <class U>
static bool all_finite_words(const U* x, std::size_t n) {
  constexpr U kAbs = ~U{0} >> 1;
  constexpr U kStep = static_cast<U>(sizeof(U) == 4 ? 0x00800000ull : 0x0010000000000000ull);
  U acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t k = 0; k < 8; ++k) acc[k] |= (x[i + k] & kAbs) + kStep;
  for (; i < n; ++i) acc[0] |= (x[i] & kAbs) + kStep;
  U all = 0;
  for (U a : acc) all |= a;
  return (all & ~kAbs) == 0;
}

// Whether a contiguous float32 / float64 view holds only finite values (the parameters of a decode
// step, W of xl among them, are checked on every call).
static bool all_finite_contiguous(const View& v) {
  const std::size_t n = static_cast<std::size_t>(v.numel());
  if (v.dtype == DType::kF32) return all_finite_words(static_cast<const std::uint32_t*>(v.data), n);
  return all_finite_words(static_cast<const std::uint64_t*>(v.data), n);
}

Status require_finite(const char* arg, const View& v) {
  if (!v.present() || !is_float(v.dtype)) return Status::Ok();  // nothing to scan (shape checks come first)
  if ((v.dtype == DType::kF32 || v.dtype == DType::kF64) && v.is_contiguous() && all_finite_contiguous(v))
    return Status::Ok();
  const std::int64_t n = v.numel();
  for (std::int64_t flat = 0; flat < n; ++flat) {
    const double x = v.get(flat);
    if (std::isfinite(x)) continue;
    // The C-order index of the first bad value, as [i, j, ...].
    std::string at;
    std::int64_t rest = flat;
    for (int d = v.ndim - 1; d >= 0; --d) {
      const std::int64_t e = v.shape[d] > 0 ? v.shape[d] : 1;
      at = std::to_string(rest % e) + (at.empty() ? "" : ", ") + at;
      rest /= e;
    }
    return Status::Invalid(arg, std::string("expected finite values, got ") +
                                    (std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf") + " at [" + at + "]");
  }
  return Status::Ok();
}

// A contiguous float32 / float64 view is copied as an array (the reference's small calls, a decode
// step among them, spend most of their time here otherwise); any other element by element.
std::vector<double> to_doubles(const View& v) {
  const std::int64_t n = v.numel();
  std::vector<double> out(static_cast<std::size_t>(n));
  if (n > 0 && v.is_contiguous() && v.dtype == DType::kF32) {
    const float* x = static_cast<const float*>(v.data);
    std::copy(x, x + n, out.begin());
  } else if (n > 0 && v.is_contiguous() && v.dtype == DType::kF64) {
    const double* x = static_cast<const double*>(v.data);
    std::copy(x, x + n, out.begin());
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = v.get(i);
  }
  return out;
}

void from_doubles(const std::vector<double>& src, const View& dst) {
  const std::int64_t n = dst.numel();
  if (n > 0 && dst.is_contiguous() && dst.dtype == DType::kF32) {
    float* y = static_cast<float*>(dst.data);
    for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(src[static_cast<std::size_t>(i)]);
  } else if (n > 0 && dst.is_contiguous() && dst.dtype == DType::kF64) {
    std::copy(src.begin(), src.begin() + n, static_cast<double*>(dst.data));
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst.set(i, src[static_cast<std::size_t>(i)]);
  }
}

namespace {

// Without ids, token l of L sits at offset + l: every one within [-2^53, 2^53], checked without
// forming a sum that could overflow.
Status check_offset(const char* arg, std::int64_t offset, std::int64_t L) {
  const std::int64_t last = L > 0 ? L - 1 : 0;
  if (offset < -kMaxPosition || offset > kMaxPosition - last)
    return Status::OutOfRange(arg, "expected positions offset .. offset + length - 1 within [-2^53, 2^53] "
                                   "(exact in double), got offset " +
                                       std::to_string(offset) + " with length " + std::to_string(L));
  return Status::Ok();
}

// id + offset, which must lie in [0, 2^53].
Status id_position(const char* arg, std::int64_t id, std::int64_t offset, std::int64_t* v) {
  if (__builtin_add_overflow(id, offset, v) || *v > kMaxPosition)
    return Status::OutOfRange(arg, "expected positions <= 2^53 (exact in double), got " +
                                       (offset == 0 ? std::to_string(id)
                                                    : std::to_string(id) + " + offset " + std::to_string(offset)));
  if (*v < 0) return Status::OutOfRange(arg, "positions must be >= 0, got " + std::to_string(*v));
  return Status::Ok();
}

}  // namespace

Expected<std::vector<std::int64_t>> expand_positions(const char* arg, const Positions& p,
                                                     std::int64_t B, std::int64_t L) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(B * L));
  if (!p.ids.present()) {
    POSENC_RETURN_IF_ERROR(check_offset(arg, p.offset, L));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t l = 0; l < L; ++l) out[static_cast<std::size_t>(b * L + l)] = p.offset + l;
    return out;
  }
  const View& ids = p.ids;
  if (!is_int(ids.dtype))
    return Status::Invalid(arg, std::string("expected int32 or int64 positions, got ") +
                                    dtype_name(ids.dtype));
  const bool flat = ids.ndim == 1 && ids.shape[0] == L;
  const bool batched = ids.ndim == 2 && ids.shape[0] == B && ids.shape[1] == L;
  if (!flat && !batched)
    return Status::Invalid(arg, "expected shape [" + std::to_string(L) + "] or [" + std::to_string(B) +
                                    ", " + std::to_string(L) + "], got " + ids.shape_str());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t l = 0; l < L; ++l) {
      std::int64_t v = 0;
      POSENC_RETURN_IF_ERROR(id_position(arg, ids.get_int(flat ? l : b * L + l), p.offset, &v));
      out[static_cast<std::size_t>(b * L + l)] = v;
    }
  return out;
}

Expected<std::vector<std::int64_t>> expand_positions_axes(const char* arg, const Positions& p, int axes,
                                                          std::int64_t B, std::int64_t L) {
  const std::int64_t A = axes;
  std::vector<std::int64_t> out(static_cast<std::size_t>(B * A * L));
  if (!p.ids.present()) {
    POSENC_RETURN_IF_ERROR(check_offset(arg, p.offset, L));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t a = 0; a < A; ++a)
        for (std::int64_t l = 0; l < L; ++l) out[static_cast<std::size_t>((b * A + a) * L + l)] = p.offset + l;
    return out;
  }
  const View& ids = p.ids;
  if (!is_int(ids.dtype))
    return Status::Invalid(arg, std::string("expected int32 or int64 positions, got ") +
                                    dtype_name(ids.dtype));
  const bool shared = ids.ndim == 2 && ids.shape[0] == A && ids.shape[1] == L;
  const bool batched = ids.ndim == 3 && ids.shape[0] == B && ids.shape[1] == A && ids.shape[2] == L;
  if (!shared && !batched)
    return Status::Invalid(arg, "expected shape [" + std::to_string(A) + ", " + std::to_string(L) + "] or [" +
                                    std::to_string(B) + ", " + std::to_string(A) + ", " + std::to_string(L) +
                                    "] (" + std::to_string(A) + " components per token), got " +
                                    ids.shape_str());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t a = 0; a < A; ++a)
      for (std::int64_t l = 0; l < L; ++l) {
        std::int64_t v = 0;
        POSENC_RETURN_IF_ERROR(id_position(arg, ids.get_int(shared ? a * L + l : (b * A + a) * L + l), p.offset, &v));
        out[static_cast<std::size_t>((b * A + a) * L + l)] = v;
      }
  return out;
}

}  // namespace posenc
