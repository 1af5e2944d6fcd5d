// Private helpers shared by the logit-bias references (alibi_ref.cc, t5_ref.cc): validation of a
// BiasGeometry and of a bias view [H, M, N] against it, and the relative distance key − query.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "posenc/bias.h"

namespace posenc::bias {

// Offsets and lengths are bounded so that every position and distance is an exact int64 and an
// exact double (2^52 is far beyond any context length).
constexpr std::int64_t kMaxExtent = std::int64_t{1} << 52;

inline Status check_geometry(const BiasGeometry& g) {
  if (g.heads < 1) return Status::Invalid("heads", "expected >= 1, got " + std::to_string(g.heads));
  if (g.q_len < 0 || g.q_len > kMaxExtent)
    return Status::Invalid("q_len", "expected 0 <= q_len <= 2^52, got " + std::to_string(g.q_len));
  if (g.k_len < 0 || g.k_len > kMaxExtent)
    return Status::Invalid("k_len", "expected 0 <= k_len <= 2^52, got " + std::to_string(g.k_len));
  // every position, the last of each side included, within [-2^52, 2^52]
  const auto q_in_range = [&](std::int64_t q_offset) {
    return q_offset >= -kMaxExtent && q_offset <= kMaxExtent - std::max<std::int64_t>(g.q_len - 1, 0);
  };
  if (g.q_offset && !q_in_range(*g.q_offset))
    return Status::Invalid("q_offset", "expected q_offset in [-2^52, 2^52 - (q_len - 1)] (every query's position "
                                       "within +-2^52), got " + std::to_string(*g.q_offset) + " with q_len = " +
                                       std::to_string(g.q_len));
  if (g.k_offset < -kMaxExtent || g.k_offset > kMaxExtent - std::max<std::int64_t>(g.k_len - 1, 0))
    return Status::Invalid("k_offset", "expected k_offset in [-2^52, 2^52 - (k_len - 1)] (every key's position "
                                       "within +-2^52), got " + std::to_string(g.k_offset) + " with k_len = " +
                                       std::to_string(g.k_len));
  if (!g.q_offset && !q_in_range(g.query_offset()))  // the default k_offset + N − M (|each| <= 2^52: no overflow)
    return Status::Invalid("q_offset", "its default k_offset + k_len - q_len = " + std::to_string(g.query_offset()) +
                                       " puts a query's position beyond +-2^52 (q_len = " + std::to_string(g.q_len) +
                                       "): give q_offset");
  return Status::Ok();
}

// A present float view of shape [H, M, N] (the geometry must have been checked first).
inline Status check_bias_view(const char* arg, const View& v, const BiasGeometry& g) {
  POSENC_RETURN_IF_ERROR(require_float(arg, v, 3));
  return require_shape(arg, v, {g.heads, g.q_len, g.k_len});
}

// Relative distance of query i and key j: key position − query position.
inline std::int64_t distance(const BiasGeometry& g, std::int64_t i, std::int64_t j) {
  return (g.k_offset + j) - (g.query_offset() + i);
}

}  // namespace posenc::bias
