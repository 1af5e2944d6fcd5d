// T5's relative position buckets (Raffel et al. 2020; Mesh TensorFlow
// transformer/transformer_layers.py _relative_position_bucket, as ported to Hugging Face T5):
//   r = key − query;  n = −r
//   bidirectional: num_buckets /= 2; bucket += num_buckets if n < 0; n = |n|
//   otherwise:     n = max(n, 0)
//   max_exact = num_buckets / 2
//   n < max_exact: bucket += n
//   else: bucket += min(max_exact + ⌊log(n/max_exact) / log(max_distance/max_exact)
//                                     · (num_buckets − max_exact)⌋, num_buckets − 1)
// The log term is evaluated in float32, as both implementations do, so that bucket edges match them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace posenc::t5 {

inline std::int64_t bucket(std::int64_t relative_position, bool bidirectional, std::int64_t num_buckets,
                           std::int64_t max_distance) {
  std::int64_t ret = 0;
  std::int64_t n = -relative_position;
  if (bidirectional) {
    num_buckets /= 2;
    if (n < 0) ret += num_buckets;
    n = n < 0 ? -n : n;
  } else {
    n = std::max<std::int64_t>(n, 0);
  }
  const std::int64_t max_exact = num_buckets / 2;
  if (n < max_exact) return ret + n;
  const float num = std::log(static_cast<float>(n) / static_cast<float>(max_exact));
  const float den = static_cast<float>(
      std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float scaled = num / den * static_cast<float>(num_buckets - max_exact);
  const std::int64_t large =
      std::min<std::int64_t>(max_exact + static_cast<std::int64_t>(scaled), num_buckets - 1);
  return ret + large;
}

}  // namespace posenc::t5
