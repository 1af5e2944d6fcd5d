// Validation shared by RoPE's reference (rope_ref.cc) and its fast dispatcher (rope_cpu.cc), so both
// return the same Status for the same bad input.
#pragma once

#include "posenc/rope.h"

namespace posenc::rope {
// Validates (in, out, p) and returns the rotary dimension r.
Expected<std::int64_t> check(const RopeParams& p, const char* in_arg, const View& in, const char* out_arg,
                             const View& out);
}  // namespace posenc::rope
