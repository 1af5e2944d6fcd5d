// posenc/rope.h — rotary position embedding (Su et al. 2021, RoFormer, arXiv 2104.09864) and the
// frequency schemes of released models (Hugging Face transformers ≥ 4.56 semantics).
//
// For a token at position m, pairs of the first r = rotary_dim dimensions are rotated by m·ω_k,
// k = 0 .. r/2−1, and scaled by the attention factor a (1 unless the scheme says otherwise);
// dimensions r .. D−1 pass through unchanged.
//
//   layout half (default): pair k = (k, k + r/2)   Hugging Face ("rotate_half"), GPT-NeoX, vLLM,
//                                                  FlashInfer, Transformer Engine
//   layout interleaved:    pair k = (2k, 2k+1)     RoFormer eq. 34, Meta's Llama code (complex
//                                                  form), GPT-J, llama.cpp's default
// (one rule for every rotary encoding and the CLI: docs/conventions.md)
//
//      x'_a = a·(x_a·cos(mω_k) − x_b·sin(mω_k))
//      x'_b = a·(x_a·sin(mω_k) + x_b·cos(mω_k))
//
//   half        (r = 8):  x0 x1 x2 x3 | x4 x5 x6 x7           pair k = (x_k, x_{k+4})
//                         k=0 1  2  3   k=0 1  2  3
//   interleaved (r = 8):  x0 x1 | x2 x3 | x4 x5 | x6 x7       pairs are neighbours
//                         k=0     k=1     k=2     k=3
//
// ---- frequency schemes (rope_type) --------------------------------------------------------------
// ω⁰_k = theta^(−2k/r) is the RoFormer frequency; s = factor, L = original_max_position.
//   default   ω_k = ω⁰_k.
//   linear    ω_k = ω⁰_k / s                                  (position interpolation, Chen et al.
//                                                              2023, arXiv 2306.15595)
//   ntk       ω_k = θ'^(−2k/r), θ' = theta·s^(r/(r−2))        (static NTK-aware base, bloc97 2023;
//                                                              not a transformers rope_type)
//   dynamic   as ntk with s replaced by s·n/L − (s − 1), n = max(seq_len, L): unchanged inside the
//             trained window n ≤ L, recomputed from the call's length beyond it (transformers'
//             _compute_dynamic_ntk_parameters; L is its max_position_embeddings).
//   yarn      ω_k = ω⁰_k/s·γ_k + ω⁰_k·(1 − γ_k), γ_k = clamp((k − lo)/(hi − lo), 0, 1), lo, hi the
//             dimensions where L·ω⁰/(2π) = beta_fast and beta_slow rotations (floored and ceiled
//             when truncate, then clamped to [0, r − 1]); a = attention_factor, else
//             m(s, mscale)/m(s, mscale_all_dim) when both are non-zero, else m(s, 1), with
//             m(s, μ) = 0.1·μ·ln s + 1 for s > 1, else 1 (Peng et al. 2023, arXiv 2309.00071,
//             eq. 17–22; transformers' _compute_yarn_parameters).
//   llama3    wavelength λ_k = 2π/ω⁰_k: λ < L/high_freq_factor keeps ω⁰_k, λ > L/low_freq_factor
//             takes ω⁰_k/s, between them (1 − g)·ω⁰_k/s + g·ω⁰_k with g = (L/λ − low)/(high − low)
//             (Meta's Llama 3.1 reference code; transformers' _compute_llama3_parameters).
//   longrope  ω_k = ω⁰_k / f_k with f = long_factor when the call's length exceeds L (or when
//             longrope_factors says so), else short_factor; a = attention_factor, else
//             √(1 + ln s / ln L) for s > 1, else 1 (Ding et al. 2024, arXiv 2402.13753;
//             transformers' _compute_longrope_parameters, Phi-3).
// Generic, after any scheme: ω_k /= freq_factors[k] (per-pair divisors, as LongRoPE's factors or
// llama.cpp's rope_freqs); or inv_freq gives ω_k outright (default scheme only).
// The attention factor multiplies cos and sin, as in transformers: q·k gains a².
//
// ---- the call's length (dynamic, longrope) ------------------------------------------------------
// Transformers recomputes these from max(position_ids) + 1 at every forward. Here the length of a
// call is seq_len when set, else derived from the call itself: the largest position of x (positions
// or offset + L − 1) plus one; in attention max(q_offset + M, k_offset + N). So no table is ever
// baked in: a decode step at position p sees length p + 1, like transformers. A caller that shards a
// sequence (or keeps a KV cache of rotated keys) passes the whole sequence's seq_len so that every
// piece sees the same frequencies; seq_len below the call's own largest position + 1 is an error.
//
// ---- angles -------------------------------------------------------------------------------------
//   accurate (default): ω_k in double and the angle m·ω_k in double: exact to double rounding (the
//     reference, |error| ≤ 5·10⁻⁸ rad at m ≤ 2^24, theta ≤ 10⁷, tested). The fast path (float32, bfloat16,
//     float16 storage) reduces that double angle exactly and evaluates sin, cos in float:
//     |error of sin, cos| ≤ 3·10⁻⁷ + |m·ω_k|·2⁻⁴⁷ (core/simd-inl.h's bound for the double angle plus
//     ω_k's own rounding), i.e. ≤ 4.2·10⁻⁷ at m ≤ 2^24 for ω_k ≤ 1 (tested for every scheme).
//   hf: the float32 arithmetic of transformers/PyTorch, for parity with existing checkpoints:
//     ω_k is computed as transformers computes it in float32, operation by operation, each rounded
//     to float32 (pow correctly rounded: PyTorch's vectorised powf may differ by one ulp on about 1%
//     of entries — pass inv_freq to use the exact float32 values of a given run), and the angle is
//     the float32 product fl32(ω_k · fl32(m)), bit for bit as inv_freq @ position_ids.float().
//     cos and sin of that float angle are then computed accurately (double in the reference, the
//     bound above in the fast path) and multiplied by the attention factor.
//
//   range: positions are bounded by 2^53 (view.h), and ω_k (after every scheme and freq_factors, in
//     the call's mode) must be <= 2^969 in accurate mode and <= 2^74 as float32 values in hf mode,
//     so that every angle is finite; larger ones (a tiny theta, factor, list entry or inv_freq) are
//     an error naming that field. The fast path's reduction holds for |angle| <= 2^47; a call with
//     a larger angle (a far position or a huge frequency) runs the reference instead, whose double
//     sin and cos reduce any finite angle exactly (the table's values).
//
// Backward is a·R(−m) (R is orthogonal, so the transpose of a·R(m) is a·R(−m)).
//
// x, y: [B, L, H, D], float32, float64, bfloat16 or float16 (math in float32 for the 16-bit types and
// float32, in double for float64); y has x's dtype and may alias x (in place). Outer strides are free.
// The fast path takes float32/bfloat16/float16 views with a contiguous last dimension; the reference
// (posenc/reference.h) is double throughout.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "posenc/view.h"

namespace posenc {

enum class RopeLayout { kInterleaved, kHalf };
enum class RopeType { kDefault, kLinear, kNtk, kDynamic, kYarn, kLlama3, kLongrope };
enum class RopeAngles { kAccurate, kHf };
enum class LongropeFactors { kByLength, kShort, kLong };  // which LongRoPE list a call uses

// Every field has a default; a field the chosen rope_type does not read must keep its default (an
// error names it otherwise), so that nothing given is silently ignored.
struct RopeParams {
  RopeLayout layout = RopeLayout::kHalf;  // pairs (k, k + r/2), as Hugging Face
  std::int64_t rotary_dim = 0;  // r; 0 means the whole head dimension D. Must be even and ≤ D.
  double theta = 10000.0;
  RopeType rope_type = RopeType::kDefault;
  double factor = 1.0;                      // s: linear, ntk, dynamic, yarn, llama3, longrope
  std::int64_t original_max_position = 0;   // L: dynamic, yarn, llama3, longrope (required there)
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  bool truncate = true;                      // yarn
  double mscale = 0.0, mscale_all_dim = 0.0;  // yarn; 0 = absent
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  std::vector<double> short_factor{}, long_factor{};     // longrope: [r/2] each
  LongropeFactors longrope_factors = LongropeFactors::kByLength;
  std::optional<double> attention_factor{};  // a, overriding the scheme's (any rope_type)
  std::vector<double> freq_factors{};        // optional [r/2]: ω_k /= freq_factors[k]
  std::vector<double> inv_freq{};            // optional [r/2]: ω_k outright (rope_type default)
  RopeAngles angles = RopeAngles::kAccurate;
  std::int64_t seq_len = 0;  // the call's length for dynamic and longrope; 0: derived (see above)

  bool operator==(const RopeParams&) const = default;
};

// Whether p sets nothing but layout, rotary_dim and theta: RoFormer's RoPE, no scheme, no overrides.
bool rope_is_plain(const RopeParams& p);

// The frequencies of one call: the one place every RoPE path reads them from (rope_forward,
// rope_backward, rope_apply_qk, both attentions, posenc rope-config and posenc table), and the
// rotary encodings of rotary.h that use RoPE's frequencies (rope2d axial's per-axis ladder, mrope,
// xpos).
struct RopeFrequencies {
  std::int64_t rotary_dim = 0;
  std::int64_t seq_len = 0;          // the length the scheme saw (dynamic, longrope)
  RopeAngles angles = RopeAngles::kAccurate;
  std::vector<double> inv_freq;      // [r/2] ω_k in double (accurate mode)
  std::vector<double> inv_freq_f32;  // [r/2] ω_k as float32 values (hf mode), held in double
  double attention_factor = 1.0;     // multiplies cos and sin
  double theta = 0.0;                // the base after ntk/dynamic scaling (theta otherwise)
  bool long_factors = false;         // longrope: the long list was used

  // The angle of pair k at position m in this call's mode: m·ω_k in double (accurate), or the
  // float32 product fl32(ω_k·fl32(m)) (hf), exactly.
  double angle(std::int64_t m, std::int64_t k) const {
    const auto i = static_cast<std::size_t>(k);
    if (angles == RopeAngles::kAccurate) return static_cast<double>(m) * inv_freq[i];
    const float fm = static_cast<float>(m);
    return static_cast<double>(static_cast<float>(inv_freq_f32[i] * static_cast<double>(fm)));
  }
};

// Validates p for head dimension D and computes the frequencies of a call whose own length
// (largest position + 1) is call_len; p.seq_len, when set, takes its place. Errors name the field.
Expected<RopeFrequencies> rope_frequencies(const RopeParams& p, std::int64_t head_dim,
                                           std::int64_t call_len);

const char* rope_layout_name(RopeLayout l);                    // "interleaved" / "half"
Expected<RopeLayout> parse_rope_layout(const std::string& s);  // inverse of the above
const char* rope_type_name(RopeType t);  // "default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope"
Expected<RopeType> parse_rope_type(const std::string& s);
const char* rope_angles_name(RopeAngles a);  // "accurate" / "hf"
Expected<RopeAngles> parse_rope_angles(const std::string& s);
const char* longrope_factors_name(LongropeFactors f);  // "by-length" / "short" / "long"
Expected<LongropeFactors> parse_longrope_factors(const std::string& s);

Status rope_forward(const RopeParams& p, const View& x, const Positions& pos, const View& y);
Status rope_backward(const RopeParams& p, const View& dy, const Positions& pos, const View& dx);

// q and k in one call (one pass computes each token's sin/cos once for every head of both):
// q, q_out: [B, L, Hq, D]; k, k_out: [B, L, Hk, Dk] (same B, L and rotary dimension; Hk may differ,
// e.g. grouped-query attention). q_out may alias q and k_out may alias k (in place); k and k_out may
// both be absent (q only). backward = true applies a·R(−m) (the gradient). Errors name q, k, q_out,
// k_out, positions or the RopeParams field at fault.
Status rope_apply_qk(const RopeParams& p, const View& q, const View& k, const Positions& pos,
                     const View& q_out, const View& k_out, bool backward = false);

// ---- Hugging Face config.json -------------------------------------------------------------------
// What a model's config.json says about its RoPE, read with transformers ≥ 4.56 semantics:
//   theta: rope_theta (GPT-NeoX: rotary_emb_base); head dimension: head_dim, else
//   hidden_size / num_attention_heads (DeepSeek-V2/V3: qk_rope_head_dim); r = int(head_dim ·
//   partial_rotary_factor) (GPT-NeoX: rotary_pct); rope_scaling with "rope_type" or "type" (Phi-3:
//   "su" and "yarn" mean longrope); layout half (transformers' rotate_half), interleaved for
//   DeepSeek-V2/V3 or rope_interleave = true. Per scheme, L and s as transformers 4.56 takes them:
//   dynamic: L = max_position_embeddings; yarn: L = rope_scaling.original_max_position_embeddings,
//   else max_position_embeddings, and s = rope_scaling.factor as given (4.56 no longer recomputes it
//   from max_position_embeddings / original_max_position_embeddings); llama3: L =
//   rope_scaling.original_max_position_embeddings; longrope: L = the top-level
//   original_max_position_embeddings, and then s = max_position_embeddings / L (as transformers,
//   whatever rope_scaling.factor says), else L = max_position_embeddings and s = rope_scaling.factor.
//   M-RoPE (Qwen2-VL, Qwen2.5-VL): rope_scaling {"type" or "rope_type": "mrope" (or "default"),
//   "mrope_section": [s_t, s_h, s_w]} is the default scheme with mrope_section set (its sum must be
//   r/2), as Qwen2VLConfig reads it.
// A field transformers accepts but does not read for the scheme is listed in notes; an unknown
// rope_type, an unknown field of rope_scaling, a top-level key about rope or rotary embeddings that
// is not understood, a missing required field or a bad value is an error naming the field
// ("rope_scaling.factor"). A model without rotary embeddings (model_type bert, gpt2, … or
// position_embedding_type other than "rotary", and no rope_theta or rope_scaling) is the error
// "config: this model has no rotary embedding (model_type bert)".
struct RopeModelConfig {
  RopeParams params;                       // layout .. inv_freq as the model was trained
  std::int64_t head_dim = 0;               // D of q and k
  std::int64_t max_position_embeddings = 0;  // 0 when absent
  std::string model_type;                  // "" when absent
  std::vector<std::string> notes;          // fields read but ignored, as transformers does
  // M-RoPE (Qwen2-VL, Qwen2.5-VL): rope_scaling.mrope_section [s_t, s_h, s_w] (sum r/2), with
  // rope_type "mrope" or "default"; empty for a 1D RoPE model. rotary.h's MropeParams take it.
  std::vector<std::int64_t> mrope_section;
};
Expected<RopeModelConfig> rope_config_from_json(const std::string& json_text);

}  // namespace posenc
