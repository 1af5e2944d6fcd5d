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
//     dWo += attᵀδ_mid, dbo += Σδ_mid, datt = δ_mid·Woᵀ → attention_backward → dqkv,
//     dWqkv += LN₁ᵀdqkv, dbqkv += Σdqkv, δ_in = δ_mid + LN₁'(dqkv·Wqkvᵀ)
//   LN'(dy) = rstd·(dy⊙g − mean(dy⊙g) − x̂·mean(dy⊙g⊙x̂)), dg += Σ dy⊙x̂, db += Σ dy.
// Bias and LayerNorm parameter gradients are summed over rows serially (a fixed order, so results do
// not depend on the thread count); the row-wise work is split over OpenMP threads.
#include "posenc/model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "posenc/absolute.h"
#include "posenc/attention.h"
#include "posenc/threads.h"
#include "posenc/view.h"

namespace posenc {
namespace {

using I = std::int64_t;
inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

constexpr double kLnEps = 1e-5;

template <typename T> constexpr DType kDType = DType::kF32;
template <> constexpr DType kDType<double> = DType::kF64;

// C[M, N] = alpha·op(A)·op(B) + beta·C, row-major.
void gemm(bool ta, bool tb, I M, I N, I K, float alpha, const float* A, I lda, const float* B, I ldb,
          float beta, float* C, I ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}
void gemm(bool ta, bool tb, I M, I N, I K, double alpha, const double* A, I lda, const double* B,
          I ldb, double beta, double* C, I ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// y [R, n] = x·W + b for x [R, k], W [k, n]; beta = 1 adds into y instead.
template <typename T>
void linear(const T* x, const T* W, const T* b, I R, I k, I n, T* y, bool accumulate) {
  if (!accumulate)
    for (I r = 0; r < R; ++r) std::memcpy(y + r * n, b, ix(n) * sizeof(T));
  else
    for (I r = 0; r < R; ++r)
      for (I j = 0; j < n; ++j) y[r * n + j] += b[j];
  gemm(false, false, R, n, k, T(1), x, k, W, n, T(1), y, n);
}

// dW [k, n] += xᵀ·dy, db [n] += Σ_r dy, dx [R, k] = dy·Wᵀ (dx may be null).
template <typename T>
void linear_backward(const T* x, const T* W, const T* dy, I R, I k, I n, T* dW, T* db, T* dx) {
  gemm(true, false, k, n, R, T(1), x, k, dy, n, T(1), dW, n);
  for (I r = 0; r < R; ++r)
    for (I j = 0; j < n; ++j) db[j] += dy[r * n + j];
  if (dx) gemm(false, true, R, k, n, T(1), dy, n, W, n, T(0), dx, k);
}

template <typename T>
void layer_norm(const T* x, const T* g, const T* b, I R, I C, T* y, T* mean, T* rstd) {
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (R * C > 32768)
  for (I r = 0; r < R; ++r) {
    const T* xr = x + r * C;
    double s = 0, ss = 0;
    for (I c = 0; c < C; ++c) s += xr[c];
    const double mu = s / double(C);
    for (I c = 0; c < C; ++c) ss += (xr[c] - mu) * (xr[c] - mu);
    const double rs = 1.0 / std::sqrt(ss / double(C) + kLnEps);
    mean[r] = T(mu);
    rstd[r] = T(rs);
    for (I c = 0; c < C; ++c) y[r * C + c] = T((xr[c] - mu) * rs) * g[c] + b[c];
  }
}

// dx [R, C] += LN'(dy) (added into the residual gradient); dg, db accumulate.
template <typename T>
void layer_norm_backward(const T* x, const T* g, const T* mean, const T* rstd, const T* dy, I R, I C,
                         T* dx, T* dg, T* db) {
  for (I r = 0; r < R; ++r)
    for (I c = 0; c < C; ++c) {
      const T xh = (x[r * C + c] - mean[r]) * rstd[r];
      dg[c] += dy[r * C + c] * xh;
      db[c] += dy[r * C + c];
    }
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (R * C > 32768)
  for (I r = 0; r < R; ++r) {
    double s1 = 0, s2 = 0;
    for (I c = 0; c < C; ++c) {
      const double dxh = double(dy[r * C + c]) * g[c];
      s1 += dxh;
      s2 += dxh * (x[r * C + c] - mean[r]) * rstd[r];
    }
    s1 /= double(C);
    s2 /= double(C);
    for (I c = 0; c < C; ++c) {
      const double xh = (double(x[r * C + c]) - mean[r]) * rstd[r];
      dx[r * C + c] += T(rstd[r] * (double(dy[r * C + c]) * g[c] - s1 - xh * s2));
    }
  }
}

// GELU, the exact form x·Φ(x), and its derivative Φ(x) + x·φ(x).
template <typename T> T gelu(T x) { return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2))); }
template <typename T> T gelu_grad(T x) {
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(M_SQRT1_2)));
  return cdf + x * T(0.5 * M_2_SQRTPI * M_SQRT1_2) * std::exp(T(-0.5) * x * x);
}

// A deterministic N(0, 1) stream: mt19937_64 bits → uniforms in (0, 1) → Box–Muller.
class Normal {
 public:
  explicit Normal(std::uint64_t seed) : rng_(seed) {}
  double next() {
    if (have_) {
      have_ = false;
      return spare_;
    }
    const double u1 = uniform(), u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * M_PI * u2;
    spare_ = r * std::sin(a);
    have_ = true;
    return r * std::cos(a);
  }

 private:
  double uniform() { return (double(rng_() >> 11) + 0.5) * 0x1.0p-53; }
  std::mt19937_64 rng_;
  double spare_ = 0;
  bool have_ = false;
};

// OpenBLAS's own thread pool sized to posenc's thread count for a pass (restored after): with more
// BLAS threads than posenc's, idle BLAS threads yield and steal time from the OpenMP ones.
struct BlasThreads {
  int prev;
  BlasThreads() : prev(openblas_get_num_threads()) { openblas_set_num_threads(num_threads()); }
  ~BlasThreads() { openblas_set_num_threads(prev); }
};

std::string layer_name(I l, const std::string& rest) { return "layers." + std::to_string(l) + "." + rest; }

}  // namespace

Status validate_config(const ModelConfig& c) {
  if (c.vocab < 2) return Status::Invalid("vocab", "must be at least 2");
  if (c.d_model < 2) return Status::Invalid("d_model", "must be at least 2");
  if (c.n_heads < 1 || c.d_model % c.n_heads != 0)
    return Status::Invalid("n_heads", "must divide d_model (" + std::to_string(c.d_model) + ")");
  if (c.n_layers < 1) return Status::Invalid("n_layers", "must be at least 1");
  if (c.d_ff < 1) return Status::Invalid("d_ff", "must be at least 1");
  if (c.max_len < 1) return Status::Invalid("max_len", "must be at least 1");
  const I D = c.head_dim();
  switch (c.encoding) {
    case Encoding::kSinusoidal:
      if (c.d_model % 2) return Status::Invalid("d_model", "must be even for sinusoidal");
      break;
    case Encoding::kRope: {
      const I r = c.rope.rotary_dim ? c.rope.rotary_dim : D;
      if (r < 2 || r % 2 || r > D)
        return Status::Invalid("rotary_dim", "must be even and in [2, head dim " + std::to_string(D) + "]");
      // Checkpoints store layout, rotary_dim and theta: the model takes plain RoPE.
      RopeParams plain;
      plain.layout = c.rope.layout;
      plain.rotary_dim = c.rope.rotary_dim;
      plain.theta = c.rope.theta;
      if (!(c.rope == plain))
        return Status::Invalid("rope", "the study's model takes plain RoPE (layout, rotary_dim, theta), "
                                       "the fields its checkpoints store");
      break;
    }
    case Encoding::kXL: {
      const I R = c.xl_dim ? c.xl_dim : D;
      if (R < 2 || R % 2) return Status::Invalid("xl_dim", "must be even and at least 2");
      break;
    }
    case Encoding::kCope:
      if (c.cope_npos < 0) return Status::Invalid("cope_npos", "must be positive (0: max_len)");
      break;
    case Encoding::kKerple: case Encoding::kSandwich: case Encoding::kFire:
      // Their learned tensors (and KERPLE/FIRE's positivity clamps) are not wired into the model yet.
      return Status::Invalid("encoding", encoding_info(c.encoding).name +
                                             " is not in the study's model yet (posenc bias and posenc "
                                             "attention take it)");
    default: break;
  }
  return Status::Ok();
}

std::vector<ParamInfo> param_layout(const ModelConfig& c) {
  std::vector<ParamInfo> out;
  std::size_t at = 0;
  auto add = [&](const std::string& name, std::vector<I> shape, bool decay) {
    std::size_t n = 1;
    for (I s : shape) n *= ix(s);
    out.push_back({name, std::move(shape), at, n, decay});
    at += n;
  };
  const I C = c.d_model, H = c.n_heads, D = c.head_dim(), F = c.d_ff;
  add("tok_emb", {c.vocab, C}, false);
  if (c.encoding == Encoding::kLearned) add("pos_emb", {c.max_len, C}, false);
  for (I l = 0; l < c.n_layers; ++l) {
    add(layer_name(l, "ln1.g"), {C}, false);
    add(layer_name(l, "ln1.b"), {C}, false);
    add(layer_name(l, "attn.wqkv"), {C, 3 * C}, true);
    add(layer_name(l, "attn.bqkv"), {3 * C}, false);
    add(layer_name(l, "attn.wo"), {C, C}, true);
    add(layer_name(l, "attn.bo"), {C}, false);
    switch (c.encoding) {
      case Encoding::kT5: add(layer_name(l, "attn.t5_bias"), {c.t5.num_buckets, H}, false); break;
      case Encoding::kAlibi:
        if (c.alibi.variant == AlibiVariant::kLearned) add(layer_name(l, "attn.alibi_w"), {2, H}, false);
        break;
      case Encoding::kXL: {
        const I R = c.xl_dim ? c.xl_dim : D;
        add(layer_name(l, "attn.xl_u"), {H, D}, false);
        add(layer_name(l, "attn.xl_v"), {H, D}, false);
        add(layer_name(l, "attn.xl_proj"), {H, D, R}, false);
        break;
      }
      case Encoding::kCope:
        add(layer_name(l, "attn.cope_table"), {c.cope_npos ? c.cope_npos : c.max_len, D}, false);
        break;
      default: break;
    }
    add(layer_name(l, "ln2.g"), {C}, false);
    add(layer_name(l, "ln2.b"), {C}, false);
    add(layer_name(l, "mlp.w1"), {C, F}, true);
    add(layer_name(l, "mlp.b1"), {F}, false);
    add(layer_name(l, "mlp.w2"), {F, C}, true);
    add(layer_name(l, "mlp.b2"), {C}, false);
  }
  add("lnf.g", {C}, false);
  add("lnf.b", {C}, false);
  return out;
}

namespace {

// Where each parameter lives, by role, for one model.
struct Slots {
  std::size_t tok_emb = 0, pos_emb = 0, lnf_g = 0, lnf_b = 0;
  struct Layer {
    std::size_t ln1_g, ln1_b, wqkv, bqkv, wo, bo, ln2_g, ln2_b, w1, b1, w2, b2;
    std::size_t enc[3] = {0, 0, 0};  // t5 W / alibi w / cope table; xl u, v, W
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
      else if (r == "attn.xl_v") L.enc[1] = p.offset;
      else if (r == "attn.xl_proj") L.enc[2] = p.offset;
      else L.enc[0] = p.offset;  // t5_bias, alibi_w, cope_table, xl_u
    }
  }
  return s;
}

AttentionParams attention_params(const ModelConfig& c) {
  AttentionParams p;
  p.encoding = c.encoding;
  p.causal = true;
  p.rope = c.rope;
  p.alibi = c.alibi;
  p.t5 = c.t5;
  p.t5.bidirectional = false;  // a decoder: T5's unidirectional buckets
  if (c.encoding == Encoding::kLearned || c.encoding == Encoding::kSinusoidal) p.encoding = Encoding::kNope;
  return p;
}

}  // namespace

template <typename T>
Model<T>::Model(const ModelConfig& c, std::uint64_t seed) : c_(c), layout_(param_layout(c)) {
  std::size_t n = 0;
  for (const ParamInfo& p : layout_) n = std::max(n, p.offset + p.size);
  w_.assign(n, T(0));
  g_.assign(n, T(0));
  Normal rnd(seed);
  // GPT-2's initialisation: N(0, 0.02), the residual projections shrunk by 1/√(2·layers), LayerNorm
  // gains 1, biases 0; encoding tensors N(0, 0.02) except xl's u, v (0) and t5's table (N(0, 0.1)).
  // The token table is N(0, 1/C) so that √C·E[token] has unit scale like the sinusoid added to it
  // (Vaswani et al. §3.4), and a learned position table starts at that scale too.
  const double resid = 0.02 / std::sqrt(2.0 * double(c.n_layers));
  for (const ParamInfo& p : layout_) {
    const std::string& nm = p.name;
    const auto ends = [&](const char* s) {
      const std::size_t k = std::strlen(s);
      return nm.size() >= k && nm.compare(nm.size() - k, k, s) == 0;
    };
    double sd = 0.02, fill = 0;
    bool random = true;
    if (ends(".g")) random = false, fill = 1;
    else if (ends(".b") || ends(".bqkv") || ends(".bo") || ends(".b1") || ends(".b2") || ends("xl_u") ||
             ends("xl_v") || ends("alibi_w"))
      random = false;
    else if (ends("attn.wo") || ends("mlp.w2")) sd = resid;
    else if (ends("t5_bias")) sd = 0.1;
    else if (nm == "tok_emb") sd = 1.0 / std::sqrt(double(c.d_model));
    else if (nm == "pos_emb") sd = 1.0;
    for (std::size_t i = 0; i < p.size; ++i) w_[p.offset + i] = T(random ? sd * rnd.next() : fill);
  }
}

template <typename T>
View Model<T>::qkv_view(const T* qkv, int which) const {
  const I C = c_.d_model, H = c_.n_heads, D = c_.head_dim();
  View v = View::contiguous(qkv + which * C, kDType<T>, {B_, L_, H, D});
  v.strides = {L_ * 3 * C, 3 * C, D, 1};
  return v;
}

template <typename T>
EncodingTensors Model<T>::enc_tensors(I l) const {
  EncodingTensors t;
  const Slots s = slots_of(c_, layout_);
  const Slots::Layer& P = s.layers[ix(l)];
  const I H = c_.n_heads, D = c_.head_dim();
  const T* w = w_.data();
  switch (c_.encoding) {
    case Encoding::kT5: t.weights = View::contiguous(w + P.enc[0], kDType<T>, {c_.t5.num_buckets, H}); break;
    case Encoding::kAlibi:
      if (c_.alibi.variant == AlibiVariant::kLearned)
        t.weights = View::contiguous(w + P.enc[0], kDType<T>, {2, H});
      break;
    case Encoding::kXL: {
      const I R = c_.xl_dim ? c_.xl_dim : D;
      t.u = View::contiguous(w + P.enc[0], kDType<T>, {H, D});
      t.v = View::contiguous(w + P.enc[1], kDType<T>, {H, D});
      t.rel_proj = View::contiguous(w + P.enc[2], kDType<T>, {H, D, R});
      break;
    }
    case Encoding::kCope:
      t.table = View::contiguous(w + P.enc[0], kDType<T>, {c_.cope_npos ? c_.cope_npos : c_.max_len, D});
      break;
    default: break;
  }
  return t;
}

template <typename T>
EncodingGrads Model<T>::enc_grads(I l) {
  // The same tensors as enc_tensors, placed in the gradient vector.
  const EncodingTensors t = enc_tensors(l);
  const auto moved = [&](const View& v) {
    if (!v.present()) return View{};
    View r = v;
    r.data = g_.data() + (static_cast<const T*>(v.data) - w_.data());
    return r;
  };
  EncodingGrads g;
  g.weights = moved(t.weights);
  g.u = moved(t.u);
  g.v = moved(t.v);
  g.rel_proj = moved(t.rel_proj);
  g.table = moved(t.table);
  return g;
}

template <typename T>
Expected<LossSum> Model<T>::forward(const std::int32_t* tokens, const std::int32_t* targets, I B, I L) {
  if (B < 1) return Status::Invalid("batch", "must be at least 1");
  if (L < 1) return Status::Invalid("length", "must be at least 1");
  if (c_.encoding == Encoding::kLearned && L > c_.max_len)
    return Status::OutOfRange("length", "a learned table of " + std::to_string(c_.max_len) +
                                            " positions cannot encode length " + std::to_string(L));
  const I C = c_.d_model, H = c_.n_heads, D = c_.head_dim(), F = c_.d_ff, V = c_.vocab, BL = B * L;
  for (I r = 0; r < BL; ++r) {
    if (tokens[r] < 0 || tokens[r] >= V)
      return Status::OutOfRange("tokens", "id " + std::to_string(tokens[r]) + " outside [0, " + std::to_string(V) + ")");
    if (targets[r] >= V)
      return Status::OutOfRange("targets", "id " + std::to_string(targets[r]) + " outside [0, " + std::to_string(V) + ")");
  }
  const Slots s = slots_of(c_, layout_);
  const BlasThreads blas;
  const T* w = w_.data();
  B_ = B;
  L_ = L;
  tokens_.assign(tokens, tokens + BL);
  targets_.assign(targets, targets + BL);
  acts_.resize(ix(c_.n_layers));

  std::vector<T>& x = x_;
  x.resize(ix(BL * C));
  const T es = T(std::sqrt(double(C)));  // Vaswani et al.: embeddings × √C, then the encoding is added
  for (I r = 0; r < BL; ++r)
    for (I c = 0; c < C; ++c) x[ix(r * C + c)] = es * w[s.tok_emb + ix(tokens[r] * C + c)];
  const View xv = View::contiguous(x.data(), kDType<T>, {B, L, C});
  if (c_.encoding == Encoding::kLearned) {
    const View tab = View::contiguous(w + s.pos_emb, kDType<T>, {c_.max_len, C});
    POSENC_RETURN_IF_ERROR(learned_forward(LearnedParams{}, xv, tab, Positions{}, xv));
  } else if (c_.encoding == Encoding::kSinusoidal) {
    POSENC_RETURN_IF_ERROR(sinusoidal_forward(SinusoidalParams{c_.sinusoid_base}, xv, Positions{}, xv));
  }

  const AttentionParams ap = attention_params(c_);
  for (I l = 0; l < c_.n_layers; ++l) {
    const Slots::Layer& P = s.layers[ix(l)];
    LayerActs& A = acts_[ix(l)];
    A.x_in = x;
    A.a.resize(ix(BL * C));
    A.mean1.resize(ix(BL));
    A.rstd1.resize(ix(BL));
    layer_norm(x.data(), w + P.ln1_g, w + P.ln1_b, BL, C, A.a.data(), A.mean1.data(), A.rstd1.data());
    A.qkv.resize(ix(BL * 3 * C));
    linear(A.a.data(), w + P.wqkv, w + P.bqkv, BL, C, 3 * C, A.qkv.data(), false);
    A.att.resize(ix(BL * C));
    POSENC_RETURN_IF_ERROR(attention_forward(ap, qkv_view(A.qkv.data(), 0), qkv_view(A.qkv.data(), 1),
                                             qkv_view(A.qkv.data(), 2), enc_tensors(l),
                                             View::contiguous(A.att.data(), kDType<T>, {B, L, H, D})));
    linear(A.att.data(), w + P.wo, w + P.bo, BL, C, C, x.data(), true);
    A.x_mid = x;
    A.m.resize(ix(BL * C));
    A.mean2.resize(ix(BL));
    A.rstd2.resize(ix(BL));
    layer_norm(x.data(), w + P.ln2_g, w + P.ln2_b, BL, C, A.m.data(), A.mean2.data(), A.rstd2.data());
    A.h.resize(ix(BL * F));
    linear(A.m.data(), w + P.w1, w + P.b1, BL, C, F, A.h.data(), false);
    A.gel.resize(ix(BL * F));
    for (I i = 0; i < BL * F; ++i) A.gel[ix(i)] = gelu(A.h[ix(i)]);
    linear(A.gel.data(), w + P.w2, w + P.b2, BL, F, C, x.data(), true);
  }
  xf_ = x;
  lnf_.resize(ix(BL * C));
  lnf_mean_.resize(ix(BL));
  lnf_rstd_.resize(ix(BL));
  layer_norm(x.data(), w + s.lnf_g, w + s.lnf_b, BL, C, lnf_.data(), lnf_mean_.data(), lnf_rstd_.data());
  probs_.resize(ix(BL * V));
  gemm(false, true, BL, V, C, T(1), lnf_.data(), C, w + s.tok_emb, C, T(0), probs_.data(), V);
  LossSum out;
  std::vector<double>& nll = nll_;
  nll.assign(ix(BL), 0.0);
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (BL * V > 65536)
  for (I r = 0; r < BL; ++r) {
    T* p = &probs_[ix(r * V)];
    const T mx = *std::max_element(p, p + V);
    const double logit_t = targets[r] >= 0 ? double(p[targets[r]]) : 0.0;
    double sum = 0;
    for (I j = 0; j < V; ++j) {
      p[j] = std::exp(p[j] - mx);
      sum += p[j];
    }
    const T inv = T(1.0 / sum);
    for (I j = 0; j < V; ++j) p[j] *= inv;
    if (targets[r] >= 0) nll[ix(r)] = std::log(sum) + double(mx) - logit_t;
  }
  for (I r = 0; r < BL; ++r)
    if (targets[r] >= 0) {
      out.nll += nll[ix(r)];
      ++out.count;
    }
  count_ = out.count;
  return out;
}

template <typename T>
Status Model<T>::backward() {
  if (B_ == 0) return Status::Invalid("backward", "needs a forward pass first");
  const I B = B_, L = L_, C = c_.d_model, H = c_.n_heads, D = c_.head_dim(), F = c_.d_ff, V = c_.vocab;
  const I BL = B * L;
  const Slots s = slots_of(c_, layout_);
  const BlasThreads blas;
  const T* w = w_.data();
  T* g = g_.data();
  std::fill(g_.begin(), g_.end(), T(0));
  if (count_ == 0) return Status::Ok();

  // logits: d = (p − onehot)/count on counted rows, 0 elsewhere
  std::vector<T>& dlog = probs_;  // turned into the logits' gradient in place
  const T invn = T(1.0 / double(count_));
  for (I r = 0; r < BL; ++r) {
    T* d = &dlog[ix(r * V)];
    if (targets_[ix(r)] < 0) {
      std::fill(d, d + V, T(0));
      continue;
    }
    d[targets_[ix(r)]] -= T(1);
    for (I j = 0; j < V; ++j) d[j] *= invn;
  }
  // logits = lnf·Eᵀ: dE += dlogᵀ·lnf, dlnf = dlog·E
  gemm(true, false, V, C, BL, T(1), dlog.data(), V, lnf_.data(), C, T(1), g + s.tok_emb, C);
  std::vector<T>& dy = dy_;
  std::vector<T>& dx = x_;
  dy.resize(ix(BL * C));
  dx.assign(ix(BL * C), T(0));
  gemm(false, false, BL, C, V, T(1), dlog.data(), V, w + s.tok_emb, C, T(0), dy.data(), C);
  layer_norm_backward(xf_.data(), w + s.lnf_g, lnf_mean_.data(), lnf_rstd_.data(), dy.data(), BL, C,
                      dx.data(), g + s.lnf_g, g + s.lnf_b);

  const AttentionParams ap = attention_params(c_);
  std::vector<T>& dh = dh_;
  std::vector<T>& dgel = dgel_;
  std::vector<T>& dqkv = dqkv_;
  std::vector<T>& datt = datt_;
  dh.resize(ix(BL * F));
  dgel.resize(ix(BL * F));
  dqkv.resize(ix(BL * 3 * C));
  datt.resize(ix(BL * C));
  for (I l = c_.n_layers - 1; l >= 0; --l) {
    const Slots::Layer& P = s.layers[ix(l)];
    const LayerActs& A = acts_[ix(l)];
    // MLP: dx is the gradient of x_out
    linear_backward(A.gel.data(), w + P.w2, dx.data(), BL, F, C, g + P.w2, g + P.b2, dgel.data());
    for (I i = 0; i < BL * F; ++i) dh[ix(i)] = dgel[ix(i)] * gelu_grad(A.h[ix(i)]);
    linear_backward(A.m.data(), w + P.w1, dh.data(), BL, C, F, g + P.w1, g + P.b1, dy.data());
    layer_norm_backward(A.x_mid.data(), w + P.ln2_g, A.mean2.data(), A.rstd2.data(), dy.data(), BL, C,
                        dx.data(), g + P.ln2_g, g + P.ln2_b);
    // attention: dx is now the gradient of x_mid
    linear_backward(A.att.data(), w + P.wo, dx.data(), BL, C, C, g + P.wo, g + P.bo, datt.data());
    POSENC_RETURN_IF_ERROR(attention_backward(
        ap, qkv_view(A.qkv.data(), 0), qkv_view(A.qkv.data(), 1), qkv_view(A.qkv.data(), 2),
        enc_tensors(l), View::contiguous(datt.data(), kDType<T>, {B, L, H, D}), qkv_view(dqkv.data(), 0),
        qkv_view(dqkv.data(), 1), qkv_view(dqkv.data(), 2), enc_grads(l)));
    linear_backward(A.a.data(), w + P.wqkv, dqkv.data(), BL, C, 3 * C, g + P.wqkv, g + P.bqkv, dy.data());
    layer_norm_backward(A.x_in.data(), w + P.ln1_g, A.mean1.data(), A.rstd1.data(), dy.data(), BL, C,
                        dx.data(), g + P.ln1_g, g + P.ln1_b);
  }
  // input: dx is the gradient of x₀ = √C·E[token] (+ absolute encoding)
  const T es = T(std::sqrt(double(C)));
  if (c_.encoding == Encoding::kLearned) {
    const View tab = View::contiguous(w + s.pos_emb, kDType<T>, {c_.max_len, C});
    POSENC_RETURN_IF_ERROR(learned_backward(LearnedParams{}, View::contiguous(dx.data(), kDType<T>, {B, L, C}),
                                            tab, Positions{}, View{},
                                            View::contiguous(g + s.pos_emb, kDType<T>, {c_.max_len, C})));
  }
  for (I r = 0; r < BL; ++r) {
    T* ge = g + s.tok_emb + ix(tokens_[ix(r)] * C);
    for (I c = 0; c < C; ++c) ge[c] += es * dx[ix(r * C + c)];
  }
  B_ = 0;  // consumed: probs_ became the logits' gradient; the next backward needs a new forward
  return Status::Ok();
}

template class Model<float>;
template class Model<double>;

}  // namespace posenc
