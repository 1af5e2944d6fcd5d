// The C ABI's shared pieces: version, the thread's last error, posenc_tensor → View.
#include <initializer_list>
#include <string>
#include <utility>

#include "capi/c_api_internal.h"

#ifndef POSENC_VERSION_STRING
#error "POSENC_VERSION_STRING is set on the posenc target (CMakeLists.txt)"
#endif

namespace posenc::capi {

namespace {

// A fixed buffer: recording an error never allocates (it may follow a failed allocation).
thread_local char t_error[1024] = "";

// Joins the parts into t_error, cut to its size (at a UTF-8 character's start), control characters
// (bytes below 0x20, and 0x7f) as spaces: one line of text.
void record(std::initializer_list<const char*> parts) {
  std::size_t n = 0;
  bool cut = false;
  for (const char* s : parts) {
    for (; s != nullptr && *s != '\0'; ++s) {
      if (n + 1 == sizeof t_error) {
        cut = true;
        break;
      }
      const auto c = static_cast<unsigned char>(*s);
      t_error[n++] = c < 0x20 || c == 0x7f ? ' ' : *s;
    }
  }
  if (cut)  // drop a character cut short: its lead byte and the continuation bytes (10xxxxxx) after it
    for (std::size_t i = n; i > 0 && n - i < 4; --i) {
      const auto c = static_cast<unsigned char>(t_error[i - 1]);
      if ((c & 0xC0) == 0x80) continue;
      const std::size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      if (n - (i - 1) < len) n = i - 1;
      break;
    }
  t_error[n] = '\0';
}

}  // namespace

int fail(const Status& s) {
  if (s.arg().empty())
    record({s.what().c_str()});
  else
    record({s.arg().c_str(), ": ", s.what().c_str()});
  switch (s.code()) {
    case Code::kOk: return POSENC_OK;
    case Code::kInvalidArgument: return POSENC_ERR_INVALID;
    case Code::kOutOfRange: return POSENC_ERR_OUT_OF_RANGE;
    case Code::kIo: case Code::kInternal: break;
  }
  return POSENC_ERR_INTERNAL;
}

int fail_nomem() {
  record({"out of memory"});
  return POSENC_ERR_NOMEM;
}

int fail_exception(const char* what) {
  record({"internal error: ", what});
  return POSENC_ERR_INTERNAL;
}

Status null_arg(const char* arg, const char* what) { return Status::Invalid(arg, what); }

namespace {

// No two elements of v share an address: sorted by stride, each stride passes the span of the
// dimensions below it (sufficient, and true of every layout a strided array library makes).
bool self_overlapping(const View& v) {
  int order[kMaxDims];
  int n = 0;
  for (int i = 0; i < v.ndim; ++i) {
    if (v.shape[i] == 0) return false;
    if (v.shape[i] > 1) order[n++] = i;
  }
  for (int j = 1; j < n; ++j)  // insertion sort by stride (at most 6 entries)
    for (int m = j; m > 0 && v.strides[order[m]] < v.strides[order[m - 1]]; --m) std::swap(order[m], order[m - 1]);
  std::int64_t span = 0;  // largest offset reached by the dimensions so far
  for (int j = 0; j < n; ++j) {
    const int i = order[j];
    if (v.strides[i] <= span) return true;
    span += (v.shape[i] - 1) * v.strides[i];
  }
  return false;
}

}  // namespace

Status to_view(const char* arg, const posenc_tensor* t, Role role, bool optional, View* out) {
  *out = View{};
  if (t == nullptr) return optional ? Status::Ok() : null_arg(arg, "expected a tensor, got NULL");
  if (t->dtype < POSENC_F32 || t->dtype > POSENC_F16)
    return Status::Invalid(arg, "unknown dtype " + std::to_string(t->dtype) +
                                    ", expected POSENC_F32, F64, I32, I64, BF16 or F16 (0 to 5)");
  if (t->ndim < 0 || t->ndim > kMaxDims)
    return Status::Invalid(arg, "expected 0 to 6 dimensions, got ndim " + std::to_string(t->ndim));
  if (t->data == nullptr) return Status::Invalid(arg, "data is NULL");
  View v;
  v.data = t->data;
  v.dtype = static_cast<DType>(t->dtype);
  v.ndim = t->ndim;
  std::int64_t span = 0;
  for (int i = 0; i < t->ndim; ++i) {
    const std::string dim = " in dimension " + std::to_string(i);
    if (t->shape[i] < 0) return Status::Invalid(arg, "negative size " + std::to_string(t->shape[i]) + dim);
    if (t->strides[i] < 0)
      return Status::Invalid(arg, "negative stride " + std::to_string(t->strides[i]) + dim +
                                      ", expected strides >= 0 (in elements)");
    std::int64_t reach = 0;
    if (t->shape[i] > 0 &&
        (__builtin_mul_overflow(t->shape[i] - 1, t->strides[i], &reach) || __builtin_add_overflow(span, reach, &span)))
      return Status::OutOfRange(arg, "shape and strides reach beyond 2^63 elements" + dim);
    v.shape[static_cast<std::size_t>(i)] = t->shape[i];
    v.strides[static_cast<std::size_t>(i)] = t->strides[i];
  }
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(span + 1, static_cast<std::int64_t>(dtype_size(v.dtype)), &bytes))
    return Status::OutOfRange(arg, "shape and strides reach beyond 2^63 bytes");
  std::int64_t elements = 1;  // a stride-0 (broadcast) dimension counts: the library may copy it
  for (int i = 0; i < t->ndim; ++i)
    if (__builtin_mul_overflow(elements, t->shape[i], &elements) || elements > POSENC_MAX_ELEMENTS)
      return Status::OutOfRange(arg, "shape " + v.shape_str() + " has more than 2^40 elements (POSENC_MAX_ELEMENTS)");
  if (role == Role::kOutput && self_overlapping(v))
    return Status::Invalid(arg, "expected an output whose strides, in order, each pass the span of the smaller ones "
                                "(so that no two elements can share an address), got shape " + v.shape_str() +
                                    " with interleaved strides");
  *out = v;
  return Status::Ok();
}

}  // namespace posenc::capi

extern "C" {

const char* posenc_version(void) { return POSENC_VERSION_STRING; }

const char* posenc_last_error(void) { return posenc::capi::t_error; }

}  // extern "C"
