// posenc/model.h — a tiny decoder-only language model for the study: which encodings extrapolate.
//
//   x₀ = √C·E[token] (+ the absolute encoding: learned or sinusoidal; Vaswani et al. §3.4)
//   per layer (pre-LayerNorm):  x += Wo·attention(LN₁(x)·Wqkv + bqkv) + bo      (causal, H heads)
//                               x += W₂·GELU(W₁·LN₂(x) + b₁) + b₂
//   logits = LN_f(x)·Eᵀ  (tied embeddings),   loss = mean cross-entropy of the next token
//
// The positional encoding sits where its kind says (registry.h): absolute ones at the input, rotary
// and bias ones inside every attention layer (posenc::attention_forward / attention_backward, the
// fused kernels), with their own learned tensors per layer (t5 W, xl u, v, W, cope table). GELU is
// the exact erf form. Forward and backward are written by hand; the projections of Model<float> run
// the attention's Highway tile GEMM (OpenBLAS for the forms it lacks, and dgemm for Model<double>),
// the row and elementwise work of Model<float> (GELU and its derivative, LayerNorm, softmax and
// cross-entropy, bias and embedding rows, AdamW) Highway kernels (src/model/model_kernels.h states
// their bounds). Model<float> trains; Model<double> (plain loops and dgemm) exists for the
// finite-difference test of the whole gradient.
//
// Threads: a pass with T = min(num_threads(), batch) > 1 splits the batch into T shards of
// consecutive sequences (shard s: sequences [B·s/T, B·(s+1)/T)), each run entirely on one thread
// (the caller and T − 1 persistent workers that sleep between passes) under ThreadScope(1), with
// OpenBLAS at one thread for the pass, so every kernel a shard calls stays on its thread. Each shard
// has its own rows of the activations and, in backward, its own gradient buffer; the buffers are
// then summed in shard order, and Σ NLL over rows in order. The gradient is that of Σ NLL / count
// over the whole batch. With one shard (one thread, or a batch of one) the pass runs on the calling
// thread and the kernels keep their own threading (the fused attention's OpenMP, OpenBLAS's pool).
//
// Determinism: parameters come from a seeded std::mt19937_64 (its output is fixed by the standard)
// through our own uniform and Box–Muller mappings, so a seed gives the same model everywhere; a run
// with T threads is bit-reproducible for that T (T = 1 included). Different T give results that
// differ by float rounding only (sums taken in other groupings).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "posenc/attention.h"
#include "posenc/bias.h"
#include "posenc/rotary.h"
#include "posenc/registry.h"
#include "posenc/status.h"

namespace posenc {

struct ModelConfig {
  Encoding encoding = Encoding::kRope;
  std::int64_t vocab = 256;    // byte vocabulary
  std::int64_t d_model = 64;   // C
  std::int64_t n_layers = 2;
  std::int64_t n_heads = 4;    // H; head dim D = C / H
  std::int64_t d_ff = 256;     // F
  std::int64_t max_len = 64;   // learned: table rows (positions past it cannot be evaluated)
  std::int64_t xl_dim = 0;     // xl: sinusoid dimension R (0: the head dim)
  std::int64_t cope_npos = 0;  // cope: table rows (0: max_len)
  RopeParams rope;
  AlibiParams alibi;
  T5Params t5;
  Rope2dParams rope2d;         // rope2d: variant (mixed: frequencies learned per layer), layout, theta
  MropeParams mrope;           // mrope: variant, mrope_section (empty: Qwen2-VL's 1/4, 3/8, 3/8 of r/2)
  XposParams xpos;             // xpos: scale_base, gamma
  KerpleParams kerple;         // kerple: the kernel (r1, r2 are learned per layer and head)
  SandwichParams sandwich;     // sandwich: parameter-free
  std::int64_t fire_width = 32;  // fire: hidden units of its MLP (the paper's 32)
  double sinusoid_base = 10000.0;

  std::int64_t head_dim() const { return d_model / n_heads; }
  // mrope's sections: mrope.mrope_section, or Qwen2-VL's proportions (16, 24, 24 of 64) of D/2 pairs.
  std::vector<std::int64_t> mrope_section() const;
};

// One named parameter tensor inside the flat parameter vector.
struct ParamInfo {
  std::string name;                  // "layers.0.attn.wqkv"
  std::vector<std::int64_t> shape;
  std::size_t offset = 0, size = 0;  // into the flat vector
  bool decay = false;                // AdamW weight decay applies (the projection matrices)
  // Kept within [lo, hi] after every optimiser step (a projection, as KERPLE's authors clamp r1, r2):
  // KERPLE's r1, r2 > 0 (power: r2 ≤ 2), FIRE's c > 0 and L ≥ 1.
  double lo = -HUGE_VAL, hi = HUGE_VAL;
};

// The layout of a model's parameters, and checks on a config ("d_model": must be a multiple of …).
Status validate_config(const ModelConfig& c);
// The bytes a float32 training step of B sequences of length L holds in activations and their
// gradients (what Model<float> sizes in its forward and backward), as a double so that any B, L fit:
// for a caller to refuse a size that cannot fit before allocating it.
double training_bytes(const ModelConfig& c, std::int64_t B, std::int64_t L);
// An error when a training step cannot fit in this machine's physical memory: naming "d_model" (or
// "d_ff", the larger part) when the weights with their gradients and AdamW state alone exceed it,
// else "batch" when training_bytes does.
Status training_fits(const ModelConfig& c, std::int64_t B, std::int64_t L);
std::vector<ParamInfo> param_layout(const ModelConfig& c);

// The result of one forward pass.
struct LossSum {
  double nll = 0;       // Σ −log p(target) over the counted tokens
  std::int64_t count = 0;
};

template <typename T>
struct ModelPass;  // model.cc: one forward or backward pass over the shards

template <typename T>
class Model {
 public:
  // A fresh model with parameters drawn from `seed`. The config must pass validate_config.
  Model(const ModelConfig& c, std::uint64_t seed);

  const ModelConfig& config() const { return c_; }
  const std::vector<ParamInfo>& layout() const { return layout_; }
  std::vector<T>& params() { return w_; }
  const std::vector<T>& params() const { return w_; }
  const std::vector<T>& grads() const { return g_; }

  // tokens, targets: [B, L] byte ids (targets < 0 are not counted). Returns Σ NLL and the count; keeps
  // what backward needs. Errors: a token outside the vocabulary, L past a learned table, …
  Expected<LossSum> forward(const std::int32_t* tokens, const std::int32_t* targets, std::int64_t B,
                            std::int64_t L);

  // The last forward's next-byte probabilities [B·L, V] (until backward consumes them).
  const std::vector<T>& probs() const { return probs_; }

  // Gradient of (Σ NLL / count) of the last forward into grads() (overwritten).
  Status backward();  // once per forward

  // forward() and backward() in one call, for training: each thread's shard of the batch runs in
  // micro-batches of whole sequences, about kMicroRows rows each, the backward of each right after
  // its forward, while its activations are still in cache. The loss and gradient of forward() then
  // backward() up to float rounding: a micro-batch's weight gradients are added to those of the ones
  // before it, and a small micro-batch's attention may take the exact reference where the whole
  // shard's took the fused kernel. Bit-reproducible for a given thread count. probs() is consumed, as
  // by backward().
  Expected<LossSum> forward_backward(const std::int32_t* tokens, const std::int32_t* targets,
                                     std::int64_t B, std::int64_t L);
  // Rows of a micro-batch of forward_backward (at least one sequence). Measured on the default study
  // model (batch 16 × 64, one thread, user CPU time of 300 steps, medians of six alternating runs):
  // 128 rows 3.49 s, 256 rows 3.42 s, the whole batch (1024) 3.60 s; forward() + backward() 3.54 s.
  static constexpr std::int64_t kMicroRows = 256;

 private:
  friend struct ModelPass<T>;
  // forward()'s checks, and the buffers of a B × L pass sized; B_ = 0 until a pass succeeds.
  Status prepare(const std::int32_t* tokens, const std::int32_t* targets, std::int64_t B, std::int64_t L);
  // The backward's scratch and the shards' gradient buffers sized, grads() zeroed.
  void prepare_backward();
  // The loss of the last forward's rows (nll_ summed in row order).
  LossSum loss_sum() const;
  // What forward keeps of one layer ([B·L, ·] row-major; x_in is the previous layer's output).
  struct LayerActs {
    // h: the MLP's pre-activation, replaced by GELU'(h) once gel = GELU(h) is formed (the backward
    // needs nothing else of it)
    std::vector<T> x_in, a, mean1, rstd1, qkv, att, x_mid, m, mean2, rstd2, h, gel;
    std::vector<double> lse;  // the attention's [B, H, L], read back by its backward
  };

  ModelConfig c_;
  std::vector<ParamInfo> layout_;
  std::vector<T> w_, g_;
  std::vector<std::vector<T>> g_shard_;  // gradients of shards 1 .. T−1 (shard 0 writes g_)
  std::vector<std::vector<T>> g_micro_;  // forward_backward: each shard's scratch (enc_set_ranges)
  std::int64_t B_ = 0, L_ = 0, count_ = 0;
  int shards_ = 1;  // the last forward's shard count; its backward splits the batch the same way
  std::vector<std::int32_t> tokens_, targets_;
  std::vector<LayerActs> acts_;
  std::vector<T> xf_, lnf_, lnf_mean_, lnf_rstd_, probs_;
  std::vector<T> dx_, dy_, dh_, dqkv_, datt_;  // backward scratch reused across steps
  std::vector<double> nll_;
};

// Checkpoints: safetensors files (float32 tensors named as in param_layout, the config as JSON in the
// header's __metadata__["posenc.config"]), written to a temporary and renamed into place;
// checkpoint_bytes is the file's content, for a caller that writes it with other outputs.
struct Checkpoint {
  ModelConfig config;
  std::vector<float> params;
};
Expected<std::string> checkpoint_bytes(const ModelConfig& c, const std::vector<float>& params);
Status save_checkpoint(const std::string& path, const ModelConfig& c, const std::vector<float>& params);
Expected<Checkpoint> load_checkpoint(const std::string& path);
// Parses a checkpoint's content (what load_checkpoint reads from its file); `name` stands for the
// source in messages. Every malformed input is a Status.
Expected<Checkpoint> checkpoint_from_bytes(const std::string& bytes, const std::string& name);

// AdamW (Loshchilov & Hutter 2019) with linear warm-up, cosine decay to min_lr_ratio·lr, and global
// gradient-norm clipping. The update runs on the calling thread through a Highway kernel
// (model_kernels.h): adamw.cc's formula in its precisions (float moments, double update).
struct AdamWConfig {
  double lr = 3e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double clip = 1.0;            // global L2 norm (≤ 0: none)
  std::int64_t warmup = 50, total = 1000;
  double min_lr_ratio = 0.1;
};

class AdamW {
 public:
  AdamW(const AdamWConfig& c, const std::vector<ParamInfo>& layout, std::size_t n);
  double lr_at(std::int64_t step) const;  // the schedule, step counted from 0
  // One update of w from g (clipped); returns the gradient norm before clipping.
  double step(std::vector<float>& w, const std::vector<float>& g);
  std::int64_t steps_done() const { return t_; }

 private:
  struct Run {  // consecutive elements that are all decayed or all not
    std::size_t offset, size;
    bool decay;
  };
  struct Bounds {  // a bounded tensor (ParamInfo::lo, hi)
    std::size_t offset, size;
    double lo, hi;
  };
  AdamWConfig c_;
  std::vector<Run> runs_;
  std::vector<Bounds> bounds_;
  std::vector<float> m_, v_;
  std::int64_t t_ = 0;
};

}  // namespace posenc
