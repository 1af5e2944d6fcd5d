// posenc/bias.h — logit biases: added to the attention logits scale·q·kᵀ, not scaled themselves.
// Bias tensors are [H, M, N]: query i sits at q_offset + i, key j at k_offset + j; −inf marks a
// (query, key) pair a head may not look at.
#pragma once

#include <vector>

#include "posenc/view.h"

namespace posenc {

struct BiasGeometry {
  std::int64_t heads = 1;
  std::int64_t q_len = 1;    // M
  std::int64_t k_len = 1;    // N
  std::int64_t q_offset = 0;
  std::int64_t k_offset = 0;
};

// ---- ALiBi (Press et al. 2022, arXiv 2108.12409) -----------------------------------------------
//   symmetric     b_h(i,j) = −m_h·|i−j|                           (with a causal mask: decoder ALiBi)
//   nonsymmetric  heads 0..H/2−1 see only the past (j ≤ i), heads H/2..H−1 only the future (j ≥ i);
//                 b = −m·|i−j| where allowed, −inf elsewhere; slopes from the rule for H/2 heads,
//                 shared by head h and head h + H/2                   (seed 002's second variant)
//   learned       weights w [2, H]: b = −σ(w[0,h])·|i−j| for j < i (past), −σ(w[1,h])·|i−j| for
//                 j > i (future), 0 on the diagonal                  (seed 002's third variant)
// Slopes by the paper's rule: for H a power of two, m_h = 2^(−8(h+1)/H); otherwise the slopes of the
// closest smaller power of two P followed by every other slope of 2P (ALiBi reference code).
enum class AlibiVariant { kSymmetric, kNonsymmetric, kLearned };

struct AlibiParams {
  AlibiVariant variant = AlibiVariant::kSymmetric;
};

const char* alibi_variant_name(AlibiVariant v);
Expected<AlibiVariant> parse_alibi_variant(const std::string& s);

// The paper's slopes for `heads` heads (heads ≥ 1).
std::vector<double> alibi_slopes(std::int64_t heads);

// slopes: optional [H] (caller-given, e.g. a tensor-parallel shard's heads; symmetric and
// nonsymmetric); weights: [2, H] for the learned variant. out: [H, M, N].
Status alibi_bias(const AlibiParams& p, const BiasGeometry& g, const View& slopes, const View& weights,
                  const View& out);
// Learned variant only: dweights [2, H] = ∂L/∂w given dbias [H, M, N] (overwritten).
Status alibi_bias_backward(const AlibiParams& p, const BiasGeometry& g, const View& weights,
                           const View& dbias, const View& dweights);

// ---- T5 relative buckets (Raffel et al. 2020; Mesh TensorFlow's _relative_position_bucket) -----
// relative position r = key − query. Bidirectional: half the buckets for r > 0. Within a direction,
// n = |r| (or max(−r, 0) when unidirectional); n < num_buckets/2 (of that direction) is exact, larger
// n fall into log-spaced buckets up to max_distance, beyond which all share the last bucket.
// The log bucket is computed in float32 as Mesh TensorFlow and Hugging Face do, so boundaries match.
struct T5Params {
  bool bidirectional = true;
  std::int64_t num_buckets = 32;
  std::int64_t max_distance = 128;
};

Status t5_validate(const T5Params& p);
std::int64_t t5_bucket(std::int64_t relative_position, const T5Params& p);

// weights: [num_buckets, H]; out: [H, M, N], out[h,i,j] = weights[bucket(j − i), h].
Status t5_bias(const T5Params& p, const BiasGeometry& g, const View& weights, const View& out);
// dweights [num_buckets, H] (overwritten) = Σ over (i, j) in the bucket of dbias[h, i, j].
Status t5_bias_backward(const T5Params& p, const BiasGeometry& g, const View& dbias, const View& dweights);

}  // namespace posenc
