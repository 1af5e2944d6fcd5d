// The study model's configuration (posenc/model.h): its checks, the parameter layout and the memory
// a training step needs.
#include <unistd.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "study/model.h"

namespace posenc {
namespace {

using I = std::int64_t;
inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

constexpr double kKerpleMin = 1e-2;  // KERPLE's r1, r2 clamped to at least this (the authors' ε)
constexpr double kFireMinC = 1e-3;   // FIRE's c kept positive

std::string layer_name(I l, const std::string& rest) { return "layers." + std::to_string(l) + "." + rest; }

}  // namespace

std::vector<std::int64_t> ModelConfig::mrope_section() const {
  if (!mrope.mrope_section.empty()) return mrope.mrope_section;
  const I pairs = head_dim() / 2, t = pairs / 4, h = (pairs - t) / 2;
  return {t, h, pairs - t - h};
}

double training_bytes(const ModelConfig& c, std::int64_t B, std::int64_t L) {
  const double C = double(c.d_model), F = double(c.d_ff), V = double(c.vocab), H = double(c.n_heads);
  // per token: each layer's x_in, a, att, x_mid, m, qkv (8C), h and gel (2F), four row statistics and
  // H doubles of lse; then xf, lnf, two statistics, V probabilities, one double of NLL, two token ids;
  // the backward's dy, dx, dqkv, datt (6C) and dh (F)
  const double layer = 8 * C + 2 * F + 4 + 2 * H;
  const double per_token = double(c.n_layers) * layer + 2 * C + 2 + V + 2 + 2 + 6 * C + F;
  return 4.0 * per_token * double(B) * double(L);
}

Status training_fits(const ModelConfig& c, std::int64_t B, std::int64_t L) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const double have = pages > 0 && page > 0 ? double(pages) * double(page) : 0;
  if (have <= 0) return Status::Ok();
  // The weights first (float32 parameters, gradients and AdamW's two moments: 16 bytes each; the
  // projections and MLP of every layer, the tied embedding, a learned table): a size that cannot fit
  // is the model's, whatever the batch.
  const double C = double(c.d_model), F = double(c.d_ff), layers = double(c.n_layers);
  const double weights = 16.0 * (layers * (4 * C * C + 2 * C * F) + double(c.vocab) * C +
                                 (c.encoding == Encoding::kLearned ? double(c.max_len) * C : 0.0));
  char msg[200];
  if (weights > have) {
    std::snprintf(msg, sizeof msg, "d_model %lld, d_ff %lld, %lld layers need %.3g GB for the weights and "
                  "their optimiser state, more than this machine's %.3g GB", (long long)c.d_model,
                  (long long)c.d_ff, (long long)c.n_layers, weights / 1e9, have / 1e9);
    return Status::OutOfRange(2 * F > 4 * C ? "d_ff" : "d_model", msg);
  }
  const double need = training_bytes(c, B, L);
  if (need > have) {
    std::snprintf(msg, sizeof msg, "%lld × %lld tokens need %.3g GB of activations, more than this "
                  "machine's %.3g GB", (long long)B, (long long)L, need / 1e9, have / 1e9);
    return Status::OutOfRange("batch", msg);
  }
  return Status::Ok();
}

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
      if (c.rope.rotary_dim == 0 && (D < 2 || D % 2))  // the default rotates the whole head
        return Status::Invalid("n_heads", "rope needs an even head dim (d_model / n_heads = " +
                                              std::to_string(D) + ")");
      const I r = c.rope.rotary_dim ? c.rope.rotary_dim : D;
      if (r < 2 || r % 2 || r > D)
        return Status::Invalid("rotary_dim", "must be even and in [2, head dim " + std::to_string(D) + "]");
      // A scaling scheme (the study's --extend) is validated as the attention will read it; the
      // model's length is its call's. Checkpoints store plain RoPE only (checkpoint_bytes).
      if (!rope_is_plain(c.rope)) POSENC_RETURN_IF_ERROR(rope_frequencies(c.rope, D, c.max_len).status());
      break;
    }
    case Encoding::kXL: {
      const I R = c.xl_dim ? c.xl_dim : D;
      if (R < 2 || R % 2)
        return c.xl_dim ? Status::Invalid("xl_dim", "must be even and at least 2")
                        : Status::Invalid("n_heads", "xl needs an even head dim (d_model / n_heads = " +
                                                         std::to_string(D) + ")");
      break;
    }
    case Encoding::kCope:
      if (c.cope_npos < 0) return Status::Invalid("cope_npos", "must be positive (0: max_len)");
      break;
    case Encoding::kRope2d: {  // checkpoints store variant, layout and theta
      if (!rope_is_plain(c.rope2d.rope) || c.rope2d.rope.rotary_dim != 0)
        return Status::Invalid("rope2d", "the study's model takes rope2d's variant, layout and theta, the "
                                         "fields its checkpoints store");
      if (D % 4) return Status::Invalid("n_heads", "rope2d needs a head dim that is a multiple of 4");
      break;
    }
    case Encoding::kMrope: {  // checkpoints store variant and sections
      MropeParams plain;
      plain.variant = c.mrope.variant;
      plain.mrope_section = c.mrope.mrope_section;
      if (!(c.mrope == plain))
        return Status::Invalid("mrope", "the study's model takes M-RoPE's variant and mrope_section, the "
                                        "fields its checkpoints store");
      if (c.mrope.mrope_section.empty() && (D < 2 || D % 2))
        return Status::Invalid("n_heads", "mrope needs an even head dim (d_model / n_heads = " +
                                              std::to_string(D) + ")");
      const std::vector<I> sec = c.mrope_section();
      if (sec.size() != 3 || sec[0] + sec[1] + sec[2] != D / 2 || D % 2)
        return Status::Invalid("mrope_section", "expected three sections summing to head dim / 2 = " +
                                                    std::to_string(D / 2));
      break;
    }
    case Encoding::kXpos: {  // checkpoints store scale_base and gamma
      XposParams plain;
      plain.scale_base = c.xpos.scale_base;
      plain.gamma = c.xpos.gamma;
      if (!(c.xpos == plain))
        return Status::Invalid("xpos", "the study's model takes xPos's scale_base and gamma, the fields its "
                                       "checkpoints store");
      if (!(c.xpos.scale_base > 0) || !(c.xpos.gamma > 0))
        return Status::Invalid("xpos", "scale_base and gamma must be > 0");
      if (D < 2 || D % 2)
        return Status::Invalid("n_heads", "xpos needs an even head dim (d_model / n_heads = " +
                                              std::to_string(D) + ")");
      break;
    }
    case Encoding::kKerple:
      if (c.kerple.kernel != KerpleKernel::kLog && c.kerple.kernel != KerpleKernel::kPower)
        return Status::Invalid("kerple", "unknown kernel");
      break;
    case Encoding::kSandwich: POSENC_RETURN_IF_ERROR(sandwich_validate(c.sandwich)); break;
    case Encoding::kFire:
      if (c.fire_width < 1) return Status::Invalid("fire_width", "must be at least 1");
      break;
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
      case Encoding::kRope2d:
        if (c.rope2d.variant == Rope2dVariant::kMixed) add(layer_name(l, "attn.rope2d_freqs"), {2, H, D / 2}, false);
        break;
      case Encoding::kKerple:  // r1, r2 > 0 (clamped to 10⁻², as the authors do); power: r2 ≤ 2
        add(layer_name(l, "attn.kerple_r1"), {H}, false);
        out.back().lo = kKerpleMin;
        add(layer_name(l, "attn.kerple_r2"), {H}, false);
        out.back().lo = kKerpleMin;
        if (c.kerple.kernel == KerpleKernel::kPower) out.back().hi = 2.0;
        break;
      case Encoding::kFire: {
        const I W = c.fire_width;
        add(layer_name(l, "attn.fire_w1"), {W}, false);
        add(layer_name(l, "attn.fire_b1"), {W}, false);
        add(layer_name(l, "attn.fire_w2"), {H, W}, false);
        add(layer_name(l, "attn.fire_b2"), {H}, false);
        add(layer_name(l, "attn.fire_c"), {1}, false);
        out.back().lo = kFireMinC;
        add(layer_name(l, "attn.fire_L"), {1}, false);
        out.back().lo = 1.0;
        break;
      }
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

}  // namespace posenc
