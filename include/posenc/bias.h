// posenc/bias.h — logit biases [H, M, N] added to scale·q·kᵀ (ALiBi, T5, KERPLE, Sandwich, FIRE).
// Formulas, parameter domains and papers: docs/bias.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "posenc/view.h"

namespace posenc {

// The bias tensor's extent: query i sits at q_offset + i, key j at k_offset + j.
struct BiasGeometry {
  std::int64_t heads = 1;
  std::int64_t q_len = 1;    // M
  std::int64_t k_len = 1;    // N
  std::optional<std::int64_t> q_offset;  // default k_offset + N − M, as attention.h's
  std::int64_t k_offset = 0;
  // −inf where the key's position exceeds the query's (attention's causal mask); the backward then
  // takes no gradient from those entries of dbias.
  bool causal = false;

  // The position of query 0: q_offset, else k_offset + k_len − q_len.
  std::int64_t query_offset() const { return q_offset.value_or(k_offset + k_len - q_len); }
};

// ---- ALiBi (Press et al. 2022): −m_h·|i − j|; variants symmetric, nonsymmetric, learned ---------
enum class AlibiVariant { kSymmetric, kNonsymmetric, kLearned };

// The variant; slopes or weights are tensor arguments of alibi_bias.
struct AlibiParams {
  AlibiVariant variant = AlibiVariant::kSymmetric;
};

const char* alibi_variant_name(AlibiVariant v);  // "symmetric" / "nonsymmetric" / "learned"
Expected<AlibiVariant> parse_alibi_variant(const std::string& s);  // inverse of the above

// The paper's slopes for `heads` heads (heads ≥ 1): 2^(−8(h+1)/H) for a power of two H.
std::vector<double> alibi_slopes(std::int64_t heads);

// slopes: optional [H] (caller-given, e.g. a tensor-parallel shard's heads; symmetric and
// nonsymmetric); weights: [2, H] for the learned variant. Both must be finite (a NaN or ±inf is an
// error naming them). out: [H, M, N].
Status alibi_bias(const AlibiParams& p, const BiasGeometry& g, const View& slopes, const View& weights,
                  const View& out);
// Learned variant only: dweights [2, H] = ∂L/∂w given dbias [H, M, N] (overwritten).
Status alibi_bias_backward(const AlibiParams& p, const BiasGeometry& g, const View& weights,
                           const View& dbias, const View& dweights);

// ---- T5 relative buckets (Raffel et al. 2020; Mesh TensorFlow's _relative_position_bucket) -----
// The bucketing of relative positions (checked by t5_validate).
struct T5Params {
  bool bidirectional = true;
  std::int64_t num_buckets = 32;
  std::int64_t max_distance = 128;
};

// Checks num_buckets and max_distance; errors name the field.
Status t5_validate(const T5Params& p);
// The bucket of relative position key − query (p valid).
std::int64_t t5_bucket(std::int64_t relative_position, const T5Params& p);

// weights: [num_buckets, H], finite; out: [H, M, N], out[h,i,j] = weights[bucket(j − i), h].
Status t5_bias(const T5Params& p, const BiasGeometry& g, const View& weights, const View& out);
// dweights [num_buckets, H] (overwritten) = Σ over (i, j) in the bucket of dbias[h, i, j].
Status t5_bias_backward(const T5Params& p, const BiasGeometry& g, const View& dbias, const View& dweights);

// ---- KERPLE (Chi et al. 2022): log −r1·log(1 + r2·d), power −r1·d^r2; d = |qp − kp| ----------
enum class KerpleKernel { kLog, kPower };

// The kernel; r1 and r2 are tensor arguments of kerple_bias.
struct KerpleParams {
  KerpleKernel kernel = KerpleKernel::kLog;
};

const char* kerple_kernel_name(KerpleKernel k);  // "log" / "power"
Expected<KerpleKernel> parse_kerple_kernel(const std::string& s);  // inverse of the above

// r1, r2: [H] each, one float dtype, finite and > 0 (power: r2 ≤ 2; else an error naming r1 or r2
// and the head); out: [H, M, N] of that dtype.
Status kerple_bias(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                   const View& out);
// dr1, dr2 [H] (each optional, overwritten; r1's dtype) = ∂L/∂r given dbias [H, M, N].
Status kerple_bias_backward(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                            const View& dbias, const View& dr1, const View& dr2);

// ---- Sandwich (Chi et al. 2023): summed sinusoid products, shifted and compressed per head -------
// The sinusoid whose products form the bias (checked by sandwich_validate).
struct SandwichParams {
  std::int64_t sinusoid_dim = 128;  // d̄, even, 2 … 65536 (d̄/2 terms per distance; beyond is a typo)
  double base = 10000.0;            // finite, > 0
};

// Checks sinusoid_dim and base; errors name the field.
Status sandwich_validate(const SandwichParams& p);
// out: [H, M, N], any float dtype. Parameter-free: no backward.
Status sandwich_bias(const SandwichParams& p, const BiasGeometry& g, const View& out);

// ---- FIRE (Li et al. 2023): f_h(ψ(d)/ψ(max(L, qp))), ψ(x) = log(c·x + 1), f a one-layer MLP ------
struct FireParams {};  // no options: the width W comes from the tensors

// The MLP and the normaliser: w1 [W], b1 [W], w2 [H, W], b2 [H], c [1], threshold (L) [1].
struct FireTensors {
  View w1, b1, w2, b2, c, threshold;
};

// t: every tensor present (float; any mix of dtypes; c and threshold finite and > 0); out: [H, M, N]
// with w2's dtype.
Status fire_bias(const FireParams& p, const BiasGeometry& g, const FireTensors& t, const View& out);
// grads: the same six (each optional, overwritten, shaped like its tensor) given dbias [H, M, N].
Status fire_bias_backward(const FireParams& p, const BiasGeometry& g, const FireTensors& t,
                          const View& dbias, const FireTensors& grads);

}  // namespace posenc
