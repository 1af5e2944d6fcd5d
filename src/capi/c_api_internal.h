// capi/c_api_internal.h — what the C ABI's files share: the opaque structs, the thread's error, the
// exception barrier and posenc_tensor → View.
#pragma once

#include <exception>
#include <initializer_list>
#include <new>

#include "posenc/attention.h"
#include "posenc/c_api.h"

struct posenc_rope_params {
  posenc::RopeParams p;
};

struct posenc_attention_params {
  posenc::AttentionParams p;
  posenc::EncodingTensors t;  // borrowed views (posenc_attention_set_tensor)
  posenc::EncodingGrads g;    // borrowed views (posenc_attention_set_grad)
};

namespace posenc::capi {

// Records s as this thread's error (one line, no allocation) and returns its C code.
int fail(const Status& s);
// The C code of a Status (POSENC_OK for ok); records the error when it is one.
inline int result(const Status& s) { return s.ok() ? POSENC_OK : fail(s); }
// Records an out-of-memory or unexpected exception and returns its code.
int fail_nomem();
int fail_exception(const char* what);

// Runs fn (returning Status) behind a barrier no C++ exception crosses.
template <class F>
int guarded(F&& fn) noexcept {
  try {
    return result(fn());
  } catch (const std::bad_alloc&) {
    return fail_nomem();
  } catch (const std::exception& e) {
    return fail_exception(e.what());
  } catch (...) {
    return fail_exception("unknown exception");
  }
}

// A NULL pointer argument as an error naming it.
Status null_arg(const char* arg, const char* what = "expected a non-NULL pointer");

enum class Role { kInput, kOutput };
// t → View, checking what the C++ View cannot express: a known dtype, 0 <= ndim <= 6, shape >= 0,
// strides >= 0, non-NULL data, extents that fit in int64, and for an output no two elements at one
// address. A NULL t is an absent view when `optional`, else an error naming arg.
Status to_view(const char* arg, const posenc_tensor* t, Role role, bool optional, View* out);

// One argument of a call, for to_views.
struct TensorArg {
  const char* name;
  const posenc_tensor* t;
  Role role;
  bool optional;
  View* view;
};
// to_view for each argument in order; the first error is returned.
inline Status to_views(std::initializer_list<TensorArg> args) {
  for (const TensorArg& a : args) {
    Status s = to_view(a.name, a.t, a.role, a.optional, a.view);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace posenc::capi
