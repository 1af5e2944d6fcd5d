// The study's tiny language model (posenc/model.h): parameters, forward and a hand-written backward.
//
// Shapes: B batch, L length, C = d_model, H heads, D = C/H, F = d_ff, V = vocab; activations are
// [B·L, ·] row-major; a weight W [in, out] maps y = x·W. The attention reads q, k and v as strided
// views of the fused qkv activation [B, L, 3, H, D] and writes its gradients the same way.
//
// Backward, per layer in reverse (x the residual stream, δ the incoming gradient of x):
//   x_out = x_mid + GELU(h)·W₂ + b₂, h = LN₂(x_mid)·W₁ + b₁:
//     dW₂ += GELU(h)ᵀδ, db₂ += Σδ, dh = (δW₂ᵀ)⊙GELU'(h), dW₁ += LN₂ᵀdh, db₁ += Σdh,
//     δ_mid = δ + LN₂'(dh·W₁ᵀ)
//   x_mid = x_in + att·Wo + bo, att = attention(LN₁(x_in)·Wqkv + bqkv):
//     dWo += attᵀδ_mid, dbo += Σδ_mid, datt = δ_mid·Woᵀ → attention_backward → dqkv (given the
//     forward's att and lse, kept per layer, so that the fused kernel need not recompute them),
//     dWqkv += LN₁ᵀdqkv, dbqkv += Σdqkv, δ_in = δ_mid + LN₁'(dqkv·Wqkvᵀ)
//   LN'(dy) = rstd·(dy⊙g − mean(dy⊙g) − x̂·mean(dy⊙g⊙x̂)), dg += Σ dy⊙x̂, db += Σ dy.
//
// Threads (model.h): the batch is cut into shards of whole sequences, one thread each, every
// shard working on its own rows [b0·L, b1·L) of the shared activation buffers and, in backward, on
// its own gradient buffer (zeroed, then filled exactly as a one-shard backward of its rows would fill
// it, with the global 1/count); the buffers are summed in shard order afterwards. Within a shard the
// bias, LayerNorm and embedding gradients are summed over its rows in order. forward_backward (the
// training step) runs each shard's sequences in micro-batches of ~Model::kMicroRows rows, the
// backward of each right after its forward, adding its gradient to the shard's (the position
// encodings' parameter gradients, which their kernels write, through a scratch). Row work goes through
// Ops<T> (model_ops.h): the Highway kernels of model_kernels.h for float, plain loops in double.
#include "study/model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "study/model_init.h"
#include "study/model_ops.h"
#include "study/shard_pool.h"
#include "posenc/absolute.h"
#include "posenc/attention.h"
#include "posenc/threads.h"
#include "posenc/view.h"

namespace posenc {
namespace {

template <typename T> constexpr DType kDType = DType::kF32;
template <> constexpr DType kDType<double> = DType::kF64;

using study_ops::gemm;
using study_ops::I;
using study_ops::ix;
using study_ops::linear;
using study_ops::linear_backward;
using study_ops::Ops;

// OpenBLAS's own thread count for a pass (restored after): posenc's count when one thread drives the
// pass, 1 when shards run on their own threads (nested BLAS threads would only fight them for cores).
struct BlasThreads {
  int prev;
  explicit BlasThreads(int n) : prev(openblas_get_num_threads()) { openblas_set_num_threads(n); }
  ~BlasThreads() { openblas_set_num_threads(prev); }
};

// Runs body(s, b0, b1) for the `shards` shards of a batch of B sequences (shard s: sequences
// [B·s/T, B·(s+1)/T)), shard 0 on the calling thread and the others on the shard pool's threads,
// each under ThreadScope(1); one shard runs on the calling thread as it is. Returns the first error in
// shard order.
template <class F>
Status run_shards(int shards, I B, const F& body) {
  if (shards <= 1) return body(0, I{0}, B);
  std::vector<Status> st(ix(shards));
  model_fast::ShardPool::instance().run(shards, [&](int s) {
    const ThreadScope one(1);
    st[ix(s)] = body(s, B * s / shards, B * (s + 1) / shards);
  });
  for (Status& x : st)
    if (!x.ok()) return x;
  return Status::Ok();
}

// Where each parameter lives, by role, for one model.
struct Slots {
  std::size_t tok_emb = 0, pos_emb = 0, lnf_g = 0, lnf_b = 0;
  struct Layer {
    std::size_t ln1_g, ln1_b, wqkv, bqkv, wo, bo, ln2_g, ln2_b, w1, b1, w2, b2;
    // t5 W / alibi w / cope table / kerple r1 / fire w1; xl v, kerple r2, fire b1; xl W, fire w2;
    // fire b2, c, L
    std::size_t enc[6] = {0, 0, 0, 0, 0, 0};
  };
  std::vector<Layer> layers;
};

Slots slots_of(const ModelConfig& c, const std::vector<ParamInfo>& layout) {
  Slots s;
  s.layers.resize(ix(c.n_layers));
  for (const ParamInfo& p : layout) {
    const std::string& n = p.name;
    if (n == "tok_emb") s.tok_emb = p.offset;
    else if (n == "pos_emb") s.pos_emb = p.offset;
    else if (n == "lnf.g") s.lnf_g = p.offset;
    else if (n == "lnf.b") s.lnf_b = p.offset;
    else {
      const std::size_t dot = n.find('.', 7);
      Slots::Layer& L = s.layers[ix(std::stoll(n.substr(7, dot - 7)))];
      const std::string r = n.substr(dot + 1);
      if (r == "ln1.g") L.ln1_g = p.offset;
      else if (r == "ln1.b") L.ln1_b = p.offset;
      else if (r == "attn.wqkv") L.wqkv = p.offset;
      else if (r == "attn.bqkv") L.bqkv = p.offset;
      else if (r == "attn.wo") L.wo = p.offset;
      else if (r == "attn.bo") L.bo = p.offset;
      else if (r == "ln2.g") L.ln2_g = p.offset;
      else if (r == "ln2.b") L.ln2_b = p.offset;
      else if (r == "mlp.w1") L.w1 = p.offset;
      else if (r == "mlp.b1") L.b1 = p.offset;
      else if (r == "mlp.w2") L.w2 = p.offset;
      else if (r == "mlp.b2") L.b2 = p.offset;
      else if (r == "attn.xl_v" || r == "attn.kerple_r2" || r == "attn.fire_b1") L.enc[1] = p.offset;
      else if (r == "attn.xl_proj" || r == "attn.fire_w2") L.enc[2] = p.offset;
      else if (r == "attn.fire_b2") L.enc[3] = p.offset;
      else if (r == "attn.fire_c") L.enc[4] = p.offset;
      else if (r == "attn.fire_L") L.enc[5] = p.offset;
      else L.enc[0] = p.offset;  // t5_bias, alibi_w, cope_table, xl_u, kerple_r1, fire_w1, rope2d_freqs
    }
  }
  return s;
}

// The (offset, size) of the parameters whose gradients the position encoding's kernels write
// rather than add to: the learned table and the attention's own (every "layers.N.attn.*" tensor but
// the projections).
std::vector<std::pair<std::size_t, std::size_t>> enc_set_ranges(const std::vector<ParamInfo>& layout) {
  std::vector<std::pair<std::size_t, std::size_t>> r;
  for (const ParamInfo& p : layout) {
    const std::size_t at = p.name.find(".attn.");
    const std::string rest = at == std::string::npos ? "" : p.name.substr(at + 6);
    if (p.name == "pos_emb" || (!rest.empty() && rest != "wqkv" && rest != "bqkv" && rest != "wo" && rest != "bo"))
      r.emplace_back(p.offset, p.size);
  }
  return r;
}

AttentionParams attention_params(const ModelConfig& c) {
  AttentionParams p;
  p.encoding = c.encoding;
  p.causal = true;
  p.rope = c.rope;
  p.alibi = c.alibi;
  p.t5 = c.t5;
  p.t5.bidirectional = false;  // a decoder: T5's unidirectional buckets
  p.kerple = c.kerple;
  p.sandwich = c.sandwich;
  p.rope2d = c.rope2d;
  p.mrope = c.mrope;
  p.mrope.mrope_section = c.mrope_section();
  p.xpos = c.xpos;
  if (c.encoding == Encoding::kLearned || c.encoding == Encoding::kSinusoidal) p.encoding = Encoding::kNope;
  return p;
}

}  // namespace


template <typename T>
Model<T>::Model(const ModelConfig& c, std::uint64_t seed) : c_(c), layout_(param_layout(c)) {
  std::size_t n = 0;
  for (const ParamInfo& p : layout_) n = std::max(n, p.offset + p.size);
  const std::vector<double> init = initial_weights(c, layout_, n, seed);
  w_.assign(init.begin(), init.end());  // each weight rounded once to T
  g_.assign(n, T(0));
}


// One pass over the shards: the parameter slots, the row operations, and each shard's work.
template <typename T>
struct ModelPass {
  Model<T>& m;
  const Slots s;
  const Ops<T> ops;
  const I C, H, D, F, V, L;

  explicit ModelPass(Model<T>& model)
      : m(model), s(slots_of(model.c_, model.layout_)), ops(), C(model.c_.d_model), H(model.c_.n_heads),
        D(model.c_.head_dim()), F(model.c_.d_ff), V(model.c_.vocab), L(model.L_) {}

  // q, k or v of Bs sequences of a [Bs, L, 3, H, D] activation.
  View qkv_view(T* qkv, I Bs, int which) const {
    View v = View::contiguous(qkv + which * C, kDType<T>, {Bs, L, H, D});
    v.strides = {L * 3 * C, 3 * C, D, 1};
    return v;
  }

  // The attention's lse of sequences [b0, b0 + Bs) of a layer, [Bs, H, L]: written by the forward,
  // read back by the backward (attention_backward_saved), which then skips recomputing the forward.
  View lse_view(typename Model<T>::LayerActs& A, I b0, I Bs) const {
    return View::contiguous(A.lse.data() + b0 * H * L, DType::kF64, {Bs, H, L});
  }

  EncodingTensors enc_tensors(I l) const {
    EncodingTensors t;
    const Slots::Layer& P = s.layers[ix(l)];
    const T* w = m.w_.data();
    const ModelConfig& c = m.c_;
    switch (c.encoding) {
      case Encoding::kT5: t.weights = View::contiguous(w + P.enc[0], kDType<T>, {c.t5.num_buckets, H}); break;
      case Encoding::kAlibi:
        if (c.alibi.variant == AlibiVariant::kLearned)
          t.weights = View::contiguous(w + P.enc[0], kDType<T>, {2, H});
        break;
      case Encoding::kXL: {
        const I R = c.xl_dim ? c.xl_dim : D;
        t.u = View::contiguous(w + P.enc[0], kDType<T>, {H, D});
        t.v = View::contiguous(w + P.enc[1], kDType<T>, {H, D});
        t.rel_proj = View::contiguous(w + P.enc[2], kDType<T>, {H, D, R});
        break;
      }
      case Encoding::kCope:
        t.table = View::contiguous(w + P.enc[0], kDType<T>, {c.cope_npos ? c.cope_npos : c.max_len, D});
        break;
      case Encoding::kRope2d:
        if (c.rope2d.variant == Rope2dVariant::kMixed)
          t.freqs = View::contiguous(w + P.enc[0], kDType<T>, {2, H, D / 2});
        break;
      case Encoding::kKerple:
        t.r1 = View::contiguous(w + P.enc[0], kDType<T>, {H});
        t.r2 = View::contiguous(w + P.enc[1], kDType<T>, {H});
        break;
      case Encoding::kFire: {
        const I W = c.fire_width;
        t.fire.w1 = View::contiguous(w + P.enc[0], kDType<T>, {W});
        t.fire.b1 = View::contiguous(w + P.enc[1], kDType<T>, {W});
        t.fire.w2 = View::contiguous(w + P.enc[2], kDType<T>, {H, W});
        t.fire.b2 = View::contiguous(w + P.enc[3], kDType<T>, {H});
        t.fire.c = View::contiguous(w + P.enc[4], kDType<T>, {1});
        t.fire.threshold = View::contiguous(w + P.enc[5], kDType<T>, {1});
        break;
      }
      default: break;
    }
    return t;
  }

  // The same tensors as enc_tensors, placed in the gradient buffer g.
  EncodingGrads enc_grads(I l, T* g) const {
    const EncodingTensors t = enc_tensors(l);
    const auto moved = [&](const View& v) {
      if (!v.present()) return View{};
      View r = v;
      r.data = g + (static_cast<const T*>(v.data) - m.w_.data());
      return r;
    };
    EncodingGrads out;
    out.weights = moved(t.weights);
    out.u = moved(t.u);
    out.v = moved(t.v);
    out.rel_proj = moved(t.rel_proj);
    out.table = moved(t.table);
    out.freqs = moved(t.freqs);
    out.r1 = moved(t.r1);
    out.r2 = moved(t.r2);
    out.fire = {moved(t.fire.w1), moved(t.fire.b1), moved(t.fire.w2), moved(t.fire.b2), moved(t.fire.c),
                moved(t.fire.threshold)};
    return out;
  }

  // Sequences [b0, b1): rows [b0·L, b1·L) of every activation, the logits turned into probabilities,
  // and the NLL of each row.
  Status forward_shard(I b0, I b1) const {
    const I Bs = b1 - b0, r0 = b0 * L, R = Bs * L, nl = m.c_.n_layers;
    const T* w = m.w_.data();
    const auto at = [&](std::vector<T>& v, I width) { return v.data() + r0 * width; };
    T* x0 = at(m.acts_[0].x_in, C);
    // Vaswani et al.: embeddings × √C, then the absolute encoding is added
    ops.embed(w + s.tok_emb, m.tokens_.data() + r0, R, C, T(std::sqrt(double(C))), x0);
    const View xv = View::contiguous(x0, kDType<T>, {Bs, L, C});
    if (m.c_.encoding == Encoding::kLearned) {
      const View tab = View::contiguous(w + s.pos_emb, kDType<T>, {m.c_.max_len, C});
      POSENC_RETURN_IF_ERROR(learned_forward(LearnedParams{}, xv, tab, Positions{}, xv));
    } else if (m.c_.encoding == Encoding::kSinusoidal) {
      POSENC_RETURN_IF_ERROR(sinusoidal_forward(SinusoidalParams{m.c_.sinusoid_base}, xv, Positions{}, xv));
    }
    const AttentionParams ap = attention_params(m.c_);
    for (I l = 0; l < nl; ++l) {
      const Slots::Layer& P = s.layers[ix(l)];
      typename Model<T>::LayerActs& A = m.acts_[ix(l)];
      T *x_in = at(A.x_in, C), *a = at(A.a, C), *qkv = at(A.qkv, 3 * C), *att = at(A.att, C),
        *x_mid = at(A.x_mid, C), *mm = at(A.m, C), *h = at(A.h, F), *gel = at(A.gel, F);
      T* x_out = l + 1 < nl ? at(m.acts_[ix(l + 1)].x_in, C) : at(m.xf_, C);
      ops.layer_norm(x_in, w + P.ln1_g, w + P.ln1_b, R, C, a, at(A.mean1, 1), at(A.rstd1, 1));
      linear(a, w + P.wqkv, w + P.bqkv, R, C, 3 * C, qkv);
      POSENC_RETURN_IF_ERROR(attention_forward(ap, qkv_view(qkv, Bs, 0), qkv_view(qkv, Bs, 1),
                                               qkv_view(qkv, Bs, 2), enc_tensors(l),
                                               View::contiguous(att, kDType<T>, {Bs, L, H, D}),
                                               lse_view(A, b0, Bs)));
      ops.add_bias_rows(x_in, w + P.bo, R, C, x_mid);  // x_mid = x_in + bo + att·Wo
      gemm(false, false, R, C, C, T(1), att, C, w + P.wo, C, T(1), x_mid, C);
      ops.layer_norm(x_mid, w + P.ln2_g, w + P.ln2_b, R, C, mm, at(A.mean2, 1), at(A.rstd2, 1));
      linear(mm, w + P.w1, w + P.b1, R, C, F, h);
      ops.gelu_with_grad(h, gel, h, R * F);  // h becomes GELU'(h), all the backward needs of it
      ops.add_bias_rows(x_mid, w + P.b2, R, C, x_out);  // x_out = x_mid + b2 + GELU(h)·W2
      gemm(false, false, R, C, F, T(1), gel, F, w + P.w2, C, T(1), x_out, C);
    }
    T* lnf = at(m.lnf_, C);
    ops.layer_norm(at(m.xf_, C), w + s.lnf_g, w + s.lnf_b, R, C, lnf, at(m.lnf_mean_, 1), at(m.lnf_rstd_, 1));
    T* logits = at(m.probs_, V);  // logits = LN_f(x)·Eᵀ, then probabilities in place
    gemm(false, true, R, V, C, T(1), lnf, C, w + s.tok_emb, C, T(0), logits, V);
    ops.softmax_xent(logits, m.targets_.data() + r0, R, V, m.nll_.data() + r0);
    return Status::Ok();
  }

  // The gradient of Σ NLL / count (count over the whole batch) from sequences [b0, b1) added into g,
  // except the position encoding's own parameters (enc_set_ranges: the attention and the learned
  // table write their gradients rather than add them), written into pg (the same layout; may be g).
  Status backward_shard(I b0, I b1, T* g, T* pg) const {
    const I Bs = b1 - b0, r0 = b0 * L, R = Bs * L;
    const T* w = m.w_.data();
    const auto at = [&](std::vector<T>& v, I width) { return v.data() + r0 * width; };
    // logits: d = (p − onehot)/count on counted rows, 0 elsewhere (in place of the probabilities)
    T* dlog = at(m.probs_, V);
    ops.xent_backward(dlog, m.targets_.data() + r0, R, V, T(1.0 / double(m.count_)));
    // logits = lnf·Eᵀ: dE += dlogᵀ·lnf, dlnf = dlog·E
    gemm(true, false, V, C, R, T(1), dlog, V, at(m.lnf_, C), C, T(1), g + s.tok_emb, C);
    T *dy = at(m.dy_, C), *dx = at(m.dx_, C), *dh = at(m.dh_, F), *dqkv = at(m.dqkv_, 3 * C),
      *datt = at(m.datt_, C);
    gemm(false, false, R, C, V, T(1), dlog, V, w + s.tok_emb, C, T(0), dy, C);
    std::fill(dx, dx + R * C, T(0));
    ops.layer_norm_backward(at(m.xf_, C), w + s.lnf_g, at(m.lnf_mean_, 1), at(m.lnf_rstd_, 1), dy, R, C, dx,
                            g + s.lnf_g, g + s.lnf_b);
    const AttentionParams ap = attention_params(m.c_);
    for (I l = m.c_.n_layers - 1; l >= 0; --l) {
      const Slots::Layer& P = s.layers[ix(l)];
      typename Model<T>::LayerActs& A = m.acts_[ix(l)];
      T* qkv = at(A.qkv, 3 * C);
      // MLP: dx is the gradient of x_out; dh holds dGELU, then dh = dGELU⊙GELU'(h) (A.h holds GELU'(h))
      linear_backward(ops, at(A.gel, F), w + P.w2, dx, R, F, C, g + P.w2, g + P.b2, dh);
      ops.mul(dh, at(A.h, F), dh, R * F);
      linear_backward(ops, at(A.m, C), w + P.w1, dh, R, C, F, g + P.w1, g + P.b1, dy);
      ops.layer_norm_backward(at(A.x_mid, C), w + P.ln2_g, at(A.mean2, 1), at(A.rstd2, 1), dy, R, C, dx,
                              g + P.ln2_g, g + P.ln2_b);
      // attention: dx is now the gradient of x_mid
      linear_backward(ops, at(A.att, C), w + P.wo, dx, R, C, C, g + P.wo, g + P.bo, datt);
      POSENC_RETURN_IF_ERROR(attention_backward_saved(
          ap, qkv_view(qkv, Bs, 0), qkv_view(qkv, Bs, 1), qkv_view(qkv, Bs, 2), enc_tensors(l),
          View::contiguous(at(A.att, C), kDType<T>, {Bs, L, H, D}), lse_view(A, b0, Bs),
          View::contiguous(datt, kDType<T>, {Bs, L, H, D}), qkv_view(dqkv, Bs, 0), qkv_view(dqkv, Bs, 1),
          qkv_view(dqkv, Bs, 2), enc_grads(l, pg)));
      linear_backward(ops, at(A.a, C), w + P.wqkv, dqkv, R, C, 3 * C, g + P.wqkv, g + P.bqkv, dy);
      ops.layer_norm_backward(at(A.x_in, C), w + P.ln1_g, at(A.mean1, 1), at(A.rstd1, 1), dy, R, C, dx,
                              g + P.ln1_g, g + P.ln1_b);
    }
    // input: dx is the gradient of x₀ = √C·E[token] (+ absolute encoding)
    if (m.c_.encoding == Encoding::kLearned) {
      const View tab = View::contiguous(w + s.pos_emb, kDType<T>, {m.c_.max_len, C});
      POSENC_RETURN_IF_ERROR(learned_backward(LearnedParams{}, View::contiguous(dx, kDType<T>, {Bs, L, C}),
                                              tab, Positions{}, View{},
                                              View::contiguous(pg + s.pos_emb, kDType<T>, {m.c_.max_len, C})));
    }
    ops.embed_backward(dx, m.tokens_.data() + r0, R, C, T(std::sqrt(double(C))), g + s.tok_emb);
    return Status::Ok();
  }
};

template <typename T>
Status Model<T>::prepare(const std::int32_t* tokens, const std::int32_t* targets, I B, I L) {
  if (B < 1) return Status::Invalid("batch", "must be at least 1");
  if (L < 1) return Status::Invalid("length", "must be at least 1");
  if (c_.encoding == Encoding::kLearned && L > c_.max_len)
    return Status::OutOfRange("length", "a learned table of " + std::to_string(c_.max_len) +
                                            " positions cannot encode length " + std::to_string(L));
  const I C = c_.d_model, F = c_.d_ff, V = c_.vocab, BL = B * L;
  for (I r = 0; r < BL; ++r) {
    if (tokens[r] < 0 || tokens[r] >= V)
      return Status::OutOfRange("tokens", "id " + std::to_string(tokens[r]) + " outside [0, " + std::to_string(V) + ")");
    if (targets[r] >= V)
      return Status::OutOfRange("targets", "id " + std::to_string(targets[r]) + " outside [0, " + std::to_string(V) + ")");
  }
  B_ = 0;  // until this pass succeeds
  L_ = L;
  tokens_.assign(tokens, tokens + BL);
  targets_.assign(targets, targets + BL);
  acts_.resize(ix(c_.n_layers));
  for (LayerActs& A : acts_) {
    for (std::vector<T>* v : {&A.x_in, &A.a, &A.att, &A.x_mid, &A.m}) v->resize(ix(BL * C));
    for (std::vector<T>* v : {&A.mean1, &A.rstd1, &A.mean2, &A.rstd2}) v->resize(ix(BL));
    A.qkv.resize(ix(BL * 3 * C));
    A.lse.resize(ix(BL * c_.n_heads));
    A.h.resize(ix(BL * F));
    A.gel.resize(ix(BL * F));
  }
  xf_.resize(ix(BL * C));
  lnf_.resize(ix(BL * C));
  lnf_mean_.resize(ix(BL));
  lnf_rstd_.resize(ix(BL));
  probs_.resize(ix(BL * V));
  nll_.assign(ix(BL), 0.0);
  shards_ = int(std::min<I>(num_threads(), B));
  return Status::Ok();
}

template <typename T>
LossSum Model<T>::loss_sum() const {
  LossSum out;
  for (std::size_t r = 0; r < targets_.size(); ++r)
    if (targets_[r] >= 0) {
      out.nll += nll_[r];
      ++out.count;
    }
  return out;
}

template <typename T>
Expected<LossSum> Model<T>::forward(const std::int32_t* tokens, const std::int32_t* targets, I B, I L) {
  POSENC_RETURN_IF_ERROR(prepare(tokens, targets, B, L));
  const BlasThreads blas(shards_ > 1 ? 1 : num_threads());
  const ModelPass<T> pass(*this);
  POSENC_RETURN_IF_ERROR(run_shards(shards_, B, [&](int, I b0, I b1) { return pass.forward_shard(b0, b1); }));
  const LossSum out = loss_sum();
  B_ = B;
  count_ = out.count;
  return out;
}

template <typename T>
void Model<T>::prepare_backward() {
  std::fill(g_.begin(), g_.end(), T(0));
  const I BL = B_ * L_, C = c_.d_model, F = c_.d_ff;
  dy_.resize(ix(BL * C));
  dx_.resize(ix(BL * C));
  dh_.resize(ix(BL * F));
  dqkv_.resize(ix(BL * 3 * C));
  datt_.resize(ix(BL * C));
  g_shard_.resize(ix(std::max(shards_ - 1, 0)));
  for (std::vector<T>& gs : g_shard_) gs.assign(g_.size(), T(0));
}

template <typename T>
Status Model<T>::backward() {
  if (B_ == 0) return Status::Invalid("backward", "needs a forward pass first");
  prepare_backward();  // grads() zeroed: all of the gradient when nothing is counted
  if (count_ == 0) return Status::Ok();
  {
    const BlasThreads blas(shards_ > 1 ? 1 : num_threads());
    const ModelPass<T> pass(*this);
    POSENC_RETURN_IF_ERROR(run_shards(shards_, B_, [&](int s, I b0, I b1) {
      T* g = s == 0 ? g_.data() : g_shard_[ix(s - 1)].data();
      return pass.backward_shard(b0, b1, g, g);
    }));
    for (const std::vector<T>& gs : g_shard_) pass.ops.add_to(g_.data(), gs.data(), I(g_.size()));
  }
  B_ = 0;  // consumed: probs_ became the logits' gradient; the next backward needs a new forward
  return Status::Ok();
}

template <typename T>
Expected<LossSum> Model<T>::forward_backward(const std::int32_t* tokens, const std::int32_t* targets, I B,
                                            I L) {
  POSENC_RETURN_IF_ERROR(prepare(tokens, targets, B, L));
  count_ = 0;  // the backward's 1/count is the whole batch's, known before any row runs
  for (I r = 0; r < B * L; ++r) count_ += targets[r] >= 0;
  B_ = B;
  prepare_backward();
  {
    const BlasThreads blas(shards_ > 1 ? 1 : num_threads());
    const ModelPass<T> pass(*this);
    const I per = std::max<I>(1, kMicroRows / L);  // sequences a micro-batch
    // The position encoding's parameter gradients of every micro-batch after a shard's first go to
    // the shard's scratch and are added to its gradient from there (the others add themselves).
    const std::vector<std::pair<std::size_t, std::size_t>> set = enc_set_ranges(layout_);
    g_micro_.resize(ix(shards_));
    const Status st = run_shards(shards_, B, [&](int s, I b0, I b1) {
      T* g = s == 0 ? g_.data() : g_shard_[ix(s - 1)].data();
      std::vector<T>& pg = g_micro_[ix(s)];
      if (!set.empty() && b1 - b0 > per) pg.resize(g_.size());
      for (I m0 = b0; m0 < b1; m0 += per) {
        const I m1 = std::min(b1, m0 + per);
        POSENC_RETURN_IF_ERROR(pass.forward_shard(m0, m1));
        if (count_ == 0) continue;
        if (m0 == b0 || set.empty()) {
          POSENC_RETURN_IF_ERROR(pass.backward_shard(m0, m1, g, g));
          continue;
        }
        for (const auto& [off, n] : set) std::fill(pg.begin() + off, pg.begin() + off + n, T(0));
        POSENC_RETURN_IF_ERROR(pass.backward_shard(m0, m1, g, pg.data()));
        for (const auto& [off, n] : set) pass.ops.add_to(g + off, pg.data() + off, I(n));
      }
      return Status::Ok();
    });
    B_ = 0;  // consumed, as by backward()
    POSENC_RETURN_IF_ERROR(st);
    for (const std::vector<T>& gs : g_shard_) pass.ops.add_to(g_.data(), gs.data(), I(g_.size()));
  }
  return loss_sum();
}

template class Model<float>;
template class Model<double>;

}  // namespace posenc
