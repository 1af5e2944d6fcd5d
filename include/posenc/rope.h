// posenc/rope.h — rotary position embedding (RoFormer) with the frequency schemes of released models.
// Formulas, schemes, angle modes, ranges and config.json reading: docs/rope.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "posenc/view.h"

namespace posenc {

enum class RopeLayout { kInterleaved, kHalf };  // pair k = (2k, 2k+1) / (k, k + r/2)
enum class RopeType { kDefault, kLinear, kNtk, kDynamic, kYarn, kLlama3, kLongrope };  // docs/rope.md
enum class RopeAngles { kAccurate, kHf };  // double angles / transformers' float32 arithmetic
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
  std::int64_t seq_len = 0;  // the call's length for dynamic and longrope; 0: derived from the call

  bool operator==(const RopeParams&) const = default;
};

// Whether p sets nothing but layout, rotary_dim and theta: RoFormer's RoPE, no scheme, no overrides.
bool rope_is_plain(const RopeParams& p);

// The frequencies of one call, as rope_frequencies computes them; every RoPE and rotary path reads
// its frequencies from here.
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
// (largest position + 1) is call_len (p.seq_len, when set, takes its place). Errors name the field.
Expected<RopeFrequencies> rope_frequencies(const RopeParams& p, std::int64_t head_dim,
                                           std::int64_t call_len);

const char* rope_layout_name(RopeLayout l);                    // "interleaved" / "half"
Expected<RopeLayout> parse_rope_layout(const std::string& s);  // inverse of the above
const char* rope_type_name(RopeType t);  // "default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope"
Expected<RopeType> parse_rope_type(const std::string& s);  // inverse of the above
const char* rope_angles_name(RopeAngles a);  // "accurate" / "hf"
Expected<RopeAngles> parse_rope_angles(const std::string& s);  // inverse of the above
const char* longrope_factors_name(LongropeFactors f);  // "by-length" / "short" / "long"
Expected<LongropeFactors> parse_longrope_factors(const std::string& s);  // inverse

// y = a·R(m)·x for x, y [B, L, H, D] (float32, float64, bfloat16, float16; y has x's dtype and may
// alias x). Errors name x, y, positions or the RopeParams field.
Status rope_forward(const RopeParams& p, const View& x, const Positions& pos, const View& y);
// dx = a·R(−m)·dy (the transpose), with rope_forward's shapes and errors.
Status rope_backward(const RopeParams& p, const View& dy, const Positions& pos, const View& dx);

// q [B, L, Hq, D] and k [B, L, Hk, Dk] rotated in one pass (q_out may alias q, k_out k; neither may
// overlap the other pair's memory; k, k_out may both be absent); backward = true applies a·R(−m). Errors name q, k, q_out, k_out, positions or
// the RopeParams field.
Status rope_apply_qk(const RopeParams& p, const View& q, const View& k, const Positions& pos,
                     const View& q_out, const View& k_out, bool backward = false);

// ---- Hugging Face config.json -------------------------------------------------------------------
// A model's RoPE as its config.json states it, read with transformers ≥ 4.56 semantics (docs/rope.md);
// a model without rotary embeddings (BERT, GPT-2) is an error naming "config".
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
// Parses config.json text; an unknown or unread rope field, a missing required field or a bad value is
// an error naming the field ("rope_scaling.factor").
Expected<RopeModelConfig> rope_config_from_json(const std::string& json_text);

}  // namespace posenc
