// Private helpers shared by the logit biases (references and fast paths): validation of a
// BiasGeometry and of a bias view [H, M, N] against it, the relative distance key − query, and the
// causal mask (bias_causal.cc) around each public function.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

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

// The same of an output (require_output's distinct addresses too).
inline Status check_bias_out(const char* arg, const View& v, const BiasGeometry& g) {
  POSENC_RETURN_IF_ERROR(require_output(arg, v, 3));
  return require_shape(arg, v, {g.heads, g.q_len, g.k_len});
}

// Relative distance of query i and key j: key position − query position.
inline std::int64_t distance(const BiasGeometry& g, std::int64_t i, std::int64_t j) {
  return (g.k_offset + j) - (g.query_offset() + i);
}

// Writes one element (`value`, in v's dtype) at the entries of v [H, M, N] (checked against g) whose
// key position exceeds the query's; nothing when !g.causal.
void set_masked(const BiasGeometry& g, const View& v, const void* value);

// Sets out [H, M, N] to −inf at the masked entries (set_masked).
void mask_causal(const BiasGeometry& g, const View& out);

// A contiguous copy of dbias [H, M, N] in its dtype, in `bytes`, with the masked entries 0.
View masked_copy(const BiasGeometry& g, const View& dbias, std::vector<unsigned char>* bytes);

// A public bias function's forward: fill(g) with the mask off, then mask_causal when it succeeded.
template <class Fill>
Status causal_forward(const BiasGeometry& g, const View& out, const Fill& fill) {
  BiasGeometry open = g;
  open.causal = false;
  POSENC_RETURN_IF_ERROR(fill(open));
  mask_causal(g, out);
  return Status::Ok();
}

// A public bias function's backward: run(g, dbias) with the mask off, on masked_copy(dbias) when
// g.causal and dbias is a valid [H, M, N] view (otherwise on dbias itself, so that the errors are the
// function's own).
template <class Run>
Status causal_backward(const BiasGeometry& g, const View& dbias, const Run& run) {
  BiasGeometry open = g;
  open.causal = false;
  if (!g.causal || !check_geometry(g).ok() || !check_bias_view("dbias", dbias, g).ok()) return run(open, dbias);
  std::vector<unsigned char> bytes;
  return run(open, masked_copy(g, dbias, &bytes));
}

}  // namespace posenc::bias
