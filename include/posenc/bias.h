// posenc/bias.h — logit biases: added to the attention logits scale·q·kᵀ, not scaled themselves.
// Bias tensors are [H, M, N]: query i sits at q_offset + i, key j at k_offset + j; −inf marks a
// (query, key) pair a head may not look at. The geometry is attention.h's: q_offset defaults to
// k_offset + N − M (the M queries are the last M positions of the N keys), so a bias computed here
// is the bias attention_forward adds for the same M, N and offsets (docs/conventions.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "posenc/view.h"

namespace posenc {

struct BiasGeometry {
  std::int64_t heads = 1;
  std::int64_t q_len = 1;    // M
  std::int64_t k_len = 1;    // N
  std::optional<std::int64_t> q_offset;  // default k_offset + N − M, as attention.h's
  std::int64_t k_offset = 0;

  // The position of query 0: q_offset, else k_offset + k_len − q_len.
  std::int64_t query_offset() const { return q_offset.value_or(k_offset + k_len - q_len); }
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
// nonsymmetric); weights: [2, H] for the learned variant. Both must be finite (a NaN or ±inf is an
// error naming them). out: [H, M, N].
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

// weights: [num_buckets, H], finite; out: [H, M, N], out[h,i,j] = weights[bucket(j − i), h].
Status t5_bias(const T5Params& p, const BiasGeometry& g, const View& weights, const View& out);
// dweights [num_buckets, H] (overwritten) = Σ over (i, j) in the bucket of dbias[h, i, j].
Status t5_bias_backward(const T5Params& p, const BiasGeometry& g, const View& dbias, const View& dweights);

// ==== the extrapolating biases beyond ALiBi =====================================================
// d = |qp − kp| below (qp = q_offset + i, kp = k_offset + j); every bias is defined for keys on
// both sides of the query (the papers use them causally; a causal attention masks the future).

// ---- KERPLE (Chi et al. 2022, arXiv 2205.09921: the power and logarithmic variants) -----------
//   log    b_h(i,j) = −r1_h·log(1 + r2_h·d)
//   power  b_h(i,j) = −r1_h·d^r2_h             (d = 0 gives 0)
// r1, r2 [H]: per-head parameters, taken as given. The paper requires r1, r2 > 0 (and r2 ≤ 2 for
// power, where the kernel stops being conditionally positive definite); the authors clamp them to
// ≥ 0.01 (and ≤ 2) around every step. posenc does not reparametrise: a value outside that domain
// (or not finite) is an error naming r1 or r2 and the head, and keeping the parameters inside it
// after an optimiser step is the training loop's job (clamp them as the authors do).
enum class KerpleKernel { kLog, kPower };

struct KerpleParams {
  KerpleKernel kernel = KerpleKernel::kLog;
};

const char* kerple_kernel_name(KerpleKernel k);
Expected<KerpleKernel> parse_kerple_kernel(const std::string& s);

// r1, r2: [H] each, one float dtype; out: [H, M, N] of that dtype.
Status kerple_bias(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                   const View& out);
// dr1, dr2 [H] (each optional, overwritten; r1's dtype) = ∂L/∂r given dbias [H, M, N]:
//   log    ∂b/∂r1 = −log(1 + r2·d),   ∂b/∂r2 = −r1·d/(1 + r2·d)
//   power  ∂b/∂r1 = −d^r2,            ∂b/∂r2 = −r1·d^r2·log d   (0 at d = 0)
Status kerple_bias_backward(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                            const View& dbias, const View& dr1, const View& dr2);

// ---- Sandwich (Chi et al. 2023, arXiv 2212.10356) -----------------------------------------------
// The inner product of two sinusoidal position embeddings of dimension d̄ (sinusoid_dim) is
// Σ_{k=1}^{d̄/2} cos((qp − kp)/base^(2k/d̄)); Sandwich keeps it as the bias, shifted by −d̄/2 (so
// that the diagonal is 0 and every bias ≤ 0; a constant per row, which softmax ignores) and
// compressed per head like ALiBi's slopes:
//   b_h(i,j) = (Σ_{k=1}^{d̄/2} cos(d/base^(2k/d̄)) − d̄/2) · H/(8(h+1)),   h = 0 … H−1
// Parameter-free: no backward. (The per-head factor and the offset as in NVIDIA NeMo's
// SandwichRelativePositionEmbedding, which implements the paper.)
struct SandwichParams {
  std::int64_t sinusoid_dim = 128;  // d̄, even, 2 … 65536 (d̄/2 terms per distance; beyond is a typo)
  double base = 10000.0;            // finite, > 0
};

Status sandwich_validate(const SandwichParams& p);
// out: [H, M, N], any float dtype.
Status sandwich_bias(const SandwichParams& p, const BiasGeometry& g, const View& out);

// ---- FIRE (Li et al. 2023, arXiv 2310.04418: progressive interpolation, a learned f_θ) ---------
//   b_h(i,j) = f_h( ψ(d) / ψ(max(L, qp)) ),   ψ(x) = log(c·x + 1),
//   f(x) = w2·relu(w1·x + b1) + b2             (one hidden layer of W units, one output per head)
// The paper defines FIRE for causal attention (query i, key j ≤ i, distance i − j); for a key after
// the query posenc uses d = |qp − kp| (as the public implementations' log(|c·(i − j)| + 1) does), so
// FIRE is symmetric in the distance. qp is the query's global position (offsets included), so a
// shard computes exactly its piece of the whole; FIRE is not shift invariant once qp > L.
// c and L are learned but taken as given, like KERPLE's: each must be finite and > 0 (then ψ(max(L,
// qp)) ≥ ψ(L) > 0 and no ε is needed); keeping them positive during training is the caller's job.
// Derivatives at the kinks: relu'(0) = 0 (a unit whose pre-activation is exactly 0 is inactive),
// and max(L, qp) passes its gradient to L when L ≥ qp.
struct FireParams {};  // no options: the width W comes from the tensors

// The MLP and the normaliser: w1 [W], b1 [W], w2 [H, W], b2 [H], c [1], threshold (L) [1].
struct FireTensors {
  View w1, b1, w2, b2, c, threshold;
};

// t: every tensor present (float; any mix of dtypes); out: [H, M, N] with w2's dtype.
Status fire_bias(const FireParams& p, const BiasGeometry& g, const FireTensors& t, const View& out);
// grads: the same six (each optional, overwritten, shaped like its tensor) given dbias [H, M, N].
Status fire_bias_backward(const FireParams& p, const BiasGeometry& g, const FireTensors& t,
                          const View& dbias, const FireTensors& grads);

}  // namespace posenc
