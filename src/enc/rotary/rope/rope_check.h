// Validation and frequencies shared by RoPE's reference (rope_ref.cc), its fast dispatcher
// (rope_cpu.cc) and the attentions, so all return the same Status for the same bad input.
#pragma once

#include "posenc/rope.h"

namespace posenc::rope {
// Validates (in, out, p) and returns the rotary dimension r.
Expected<std::int64_t> check(const RopeParams& p, const char* in_arg, const View& in, const char* out_arg,
                             const View& out);
// The error for a rotary dimension that is not a multiple of `multiple` in [multiple, D]: with
// rotary_dim 0 (the whole head), it is the head dimension D that is wrong.
Status rotary_dim_error(std::int64_t rotary_dim, std::int64_t D, std::int64_t multiple);
// Validates every field of p for rotary dimension r (everything but seq_len against the call).
Status check_params(const RopeParams& p, std::int64_t r);
// The call's seq_len, when set, may not be below its own length (largest position + 1).
Status check_call(const RopeParams& p, std::int64_t call_len);
// The frequencies of a call whose largest position is call_len − 1 (p validated by check_params).
Expected<RopeFrequencies> frequencies(const RopeParams& p, std::int64_t r, std::int64_t call_len);
// What of the call's length n the frequencies depend on (0 for the static schemes): a cache key.
std::int64_t length_key(const RopeParams& p, std::int64_t n);
// The call's own length: largest position + 1 (0 for no tokens).
inline std::int64_t call_length(const std::vector<std::int64_t>& positions) {
  std::int64_t m = -1;
  for (std::int64_t v : positions) m = v > m ? v : m;
  return m + 1;
}
}  // namespace posenc::rope
