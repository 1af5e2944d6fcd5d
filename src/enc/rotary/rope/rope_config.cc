// A Hugging Face config.json read as transformers ≥ 4.56 reads it for RoPE (see docs/rope.md).
//
// Facts relied on, from transformers' sources (src/transformers/modeling_rope_utils.py of the 4.56
// line, after PR #40320 "explicit factor > implicit factor in YaRN"; the model configs named):
//   * every scheme: base = config.rope_theta; dim = int(head_dim · partial_rotary_factor) with
//     head_dim = config.head_dim or hidden_size // num_attention_heads, partial_rotary_factor
//     default 1.0; rope_type = rope_scaling["rope_type"], else rope_scaling["type"].
//   * GPTNeoXConfig (Pythia): rope_theta = rotary_emb_base, partial_rotary_factor = rotary_pct.
//   * DeepseekV3Config / DeepseekV2Config: head_dim = qk_rope_head_dim (the rotated part of q, k);
//     DeepSeek-V3 applies RoPE to interleaved pairs (rope_interleave, default true); its attention
//     (DeepseekV3Attention) multiplies the softmax scale by m(factor, mscale_all_dim)² when
//     mscale_all_dim is set, which is reported in notes.
//   * Phi3Config: rope_scaling type "su" or "yarn" is renamed "longrope"; the pretrained length is
//     the top-level original_max_position_embeddings.
//   * Qwen2VLConfig / Qwen2_5_VLConfig: rope_scaling type "mrope" is renamed "default";
//     mrope_section ([16, 24, 24] for head_dim 128) goes to the multimodal rotary embedding.
//   * dynamic: window = max_position_embeddings (rope_scaling's original_max_position_embeddings is
//     accepted by the validator but not read).
//   * yarn: factor = rope_scaling["factor"]; original length = rope_scaling.get(
//     "original_max_position_embeddings") or max_position_embeddings; attention_factor, beta_fast
//     (default 32), beta_slow (1), mscale, mscale_all_dim, truncate (default true) from rope_scaling.
//     Before PR #40320 (≤ 4.55) the factor was replaced by max_position_embeddings /
//     original_max_position_embeddings whenever the latter was given (Qwen2.5's recommended
//     {factor 4, original 32768} with max_position_embeddings 32768 then ran with factor 1); 4.56
//     uses the explicit factor and only warns.
//   * llama3: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings, all
//     required in rope_scaling.
//   * longrope: short_factor, long_factor required; when the config has a top-level
//     original_max_position_embeddings, L = that and factor = max_position_embeddings / L whatever
//     rope_scaling["factor"] says; else L = max_position_embeddings and factor = rope_scaling["factor"].
// Where transformers would take a model class's default for a missing field (rope_theta, rotary_pct),
// this reader asks for the field instead.
#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/format.h"
#include "posenc/rope.h"

namespace posenc {
namespace {

using json = nlohmann::json;

std::string num(double x) { return format_number(x); }

std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

struct Reader {
  const json& obj;
  std::string prefix;  // "" or "rope_scaling."

  bool has(const char* key) const { return obj.contains(key) && !obj.at(key).is_null(); }
  std::string name(const char* key) const { return prefix + key; }

  Expected<std::optional<double>> number(const char* key) const {
    if (!has(key)) return std::optional<double>{};
    const json& v = obj.at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>()))
      return Status::Invalid(name(key), "expected a finite number, got " + shown(v));
    return std::optional<double>{v.get<double>()};
  }
  Expected<std::optional<double>> positive(const char* key) const {
    auto v = number(key);
    if (!v.ok() || !v->has_value()) return v;
    if (!(**v > 0)) return Status::Invalid(name(key), "expected a number > 0, got " + num(**v));
    return v;
  }
  Expected<std::optional<std::int64_t>> integer(const char* key) const {
    if (!has(key)) return std::optional<std::int64_t>{};
    const json& v = obj.at(key);
    if (!v.is_number() || v.get<double>() != std::floor(v.get<double>()) || !(v.get<double>() >= 1) ||
        v.get<double>() > 9.0e15)
      return Status::Invalid(name(key), "expected an integer >= 1, got " + shown(v));
    return std::optional<std::int64_t>{static_cast<std::int64_t>(v.get<double>())};
  }
  Expected<std::optional<bool>> boolean(const char* key) const {
    if (!has(key)) return std::optional<bool>{};
    const json& v = obj.at(key);
    if (!v.is_boolean()) return Status::Invalid(name(key), "expected true or false, got " + shown(v));
    return std::optional<bool>{v.get<bool>()};
  }
  Expected<std::optional<std::string>> string(const char* key) const {
    if (!has(key)) return std::optional<std::string>{};
    const json& v = obj.at(key);
    if (!v.is_string()) return Status::Invalid(name(key), "expected a string, got " + shown(v));
    return std::optional<std::string>{v.get<std::string>()};
  }
  Expected<std::vector<double>> list(const char* key, std::int64_t want) const {
    if (!has(key)) return Status::Invalid(name(key), "missing (a list of r/2 = " + std::to_string(want) + " numbers)");
    const json& v = obj.at(key);
    if (!v.is_array()) return Status::Invalid(name(key), "expected a list of numbers, got " + shown(v));
    std::vector<double> out;
    for (const json& e : v) {
      if (!e.is_number() || !std::isfinite(e.get<double>()) || !(e.get<double>() > 0))
        return Status::Invalid(name(key), "expected numbers > 0, got " + shown(e) + " at " + std::to_string(out.size()));
      out.push_back(e.get<double>());
    }
    if (static_cast<std::int64_t>(out.size()) != want)
      return Status::Invalid(name(key), "expected r/2 = " + std::to_string(want) + " numbers (one per rotated pair), got " +
                                            std::to_string(out.size()));
    return out;
  }
};

#define POSENC_TAKE(var, expr)            \
  auto var##_e = (expr);                  \
  if (!var##_e.ok()) return var##_e.status(); \
  auto var = std::move(var##_e).value()

// The rope_scaling fields each rope_type reads (besides rope_type / type), as transformers 4.56.
const std::map<std::string, std::set<std::string>>& scheme_fields() {
  static const std::map<std::string, std::set<std::string>> m = {
      {"default", {}},
      {"linear", {"factor"}},
      {"ntk", {"factor"}},
      {"dynamic", {"factor", "original_max_position_embeddings"}},
      {"yarn",
       {"factor", "attention_factor", "beta_fast", "beta_slow", "original_max_position_embeddings", "mscale",
        "mscale_all_dim", "truncate"}},
      {"llama3", {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}},
      {"longrope", {"short_factor", "long_factor", "factor", "attention_factor", "original_max_position_embeddings"}},
  };
  return m;
}

bool is_neox(const std::string& mt) { return mt.empty() || mt == "gpt_neox" || mt == "gpt_neox_japanese"; }
bool is_deepseek(const std::string& mt) { return mt == "deepseek_v2" || mt == "deepseek_v3"; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// config.json's text as JSON. A key given twice in one object is refused: the JSON library keeps the
// last, so which the user meant is unknown (the parser's callback sees every key with its object's
// depth).
Expected<json> parse_config(const std::string& text) {
  json j;
  std::vector<std::set<std::string>> keys;
  std::string twice;
  const json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    const auto d = static_cast<std::size_t>(depth);
    if (event == json::parse_event_t::object_start) {  // a new object at depth d: its key set, empty
      keys.resize(d + 1);
      keys[d].clear();
    } else if (event == json::parse_event_t::key && d >= 1 && d <= keys.size() &&
               !keys[d - 1].insert(parsed.get<std::string>()).second && twice.empty()) {
      twice = parsed.get<std::string>();
    }
    return true;
  };
  try {
    j = json::parse(text, note_keys);
  } catch (const json::exception& e) {  // a syntax error, or a number beyond double ("1e400")
    std::string what = e.what();
    if (const std::size_t at = what.find("] "); what.rfind("[json.exception", 0) == 0 && at != std::string::npos)
      what.erase(0, at + 2);
    return Status::Invalid("config", "not valid JSON: " + what);
  }
  if (!twice.empty()) return Status::Invalid(twice, "given twice in one object of the config");
  if (!j.is_object()) return Status::Invalid("config", "expected a JSON object (a config.json)");
  return j;
}

// The top level's keys: one about rotary embeddings that this reader does not understand is an
// error; so is a model without rotary embeddings (absolute, learned or relative positions, ALiBi):
// known model types, or position_embedding_type (BERT's family) other than "rotary", with no RoPE
// field.
Status check_top(const json& j, const Reader& top, const std::string& mt) {
  static const std::set<std::string> known = {
      "rope_theta", "rope_scaling", "partial_rotary_factor", "rotary_pct", "rotary_emb_base", "qk_rope_head_dim",
      "rope_interleave"};
  for (const auto& [key, value] : j.items()) {
    if (key == "rope_parameters")
      return Status::Invalid("rope_parameters", "the transformers v5 format is not read; posenc follows 4.56's "
                                                "rope_theta + rope_scaling");
    const std::string k = lower(key);
    if ((k.find("rope") != std::string::npos || k.find("rotary") != std::string::npos) && !known.count(key))
      return Status::Invalid(key, "not understood (posenc reads rope_theta, rope_scaling, partial_rotary_factor, "
                                  "rotary_pct, rotary_emb_base, qk_rope_head_dim, rope_interleave)");
  }
  static const std::set<std::string> no_rotary = {
      "bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2",
      "gpt2", "gpt_bigcode", "opt", "bloom", "mpt", "t5", "mt5", "bart", "mbart", "whisper"};
  POSENC_TAKE(pet, top.string("position_embedding_type"));
  const bool rope_fields = top.has("rope_theta") || top.has("rotary_emb_base") || top.has("rope_scaling");
  if (!rope_fields && (no_rotary.count(mt) || (pet && *pet != "rotary")))
    return Status::Invalid("config", "this model has no rotary embedding (model_type " +
                                         (mt.empty() ? std::string("absent") : mt) +
                                         (pet && !no_rotary.count(mt) ? ", position_embedding_type " + *pet : "") +
                                         ")");
  return Status::Ok();
}

// theta: rope_theta, or GPT-NeoX's rotary_emb_base.
Expected<double> read_theta(const Reader& top, const std::string& mt) {
  POSENC_TAKE(rope_theta, top.positive("rope_theta"));
  POSENC_TAKE(rotary_emb_base, top.positive("rotary_emb_base"));
  if (rotary_emb_base) {
    if (!is_neox(mt))
      return Status::Invalid("rotary_emb_base", "read only for GPT-NeoX configs (model_type gpt_neox), this one is " + mt);
    if (rope_theta && *rope_theta != *rotary_emb_base)
      return Status::Invalid("rope_theta", "GPT-NeoX takes rotary_emb_base = " + num(*rotary_emb_base) +
                                               " as its theta, but rope_theta says " + num(*rope_theta));
    return *rotary_emb_base;
  }
  if (rope_theta) return *rope_theta;
  return Status::Invalid(mt.rfind("gpt_neox", 0) == 0 ? "rotary_emb_base" : "rope_theta",
                         "missing (transformers would take its model class's default; give it explicitly)");
}

// head_dim: DeepSeek's qk_rope_head_dim, head_dim, or hidden_size / num_attention_heads.
Expected<std::int64_t> read_head_dim(const Reader& top, const std::string& mt) {
  POSENC_TAKE(head_dim, top.integer("head_dim"));
  POSENC_TAKE(qk_rope, top.integer("qk_rope_head_dim"));
  if (qk_rope && !is_deepseek(mt))
    return Status::Invalid("qk_rope_head_dim", "read only for DeepSeek-V2/V3 configs (model_type deepseek_v2, "
                                               "deepseek_v3), this one is '" + mt + "'");
  if (is_deepseek(mt)) {
    if (!qk_rope) return Status::Invalid("qk_rope_head_dim", "missing (DeepSeek's rotated head dimension)");
    if (head_dim && *head_dim != *qk_rope)
      return Status::Invalid("head_dim", "DeepSeek rotates qk_rope_head_dim = " + std::to_string(*qk_rope) +
                                             " dimensions, but head_dim says " + std::to_string(*head_dim));
    return *qk_rope;
  }
  if (head_dim) return *head_dim;
  POSENC_TAKE(hidden, top.integer("hidden_size"));
  POSENC_TAKE(heads, top.integer("num_attention_heads"));
  if (!hidden) return Status::Invalid("hidden_size", "missing (needed for head_dim = hidden_size / num_attention_heads)");
  if (!heads) return Status::Invalid("num_attention_heads", "missing (needed for head_dim = hidden_size / num_attention_heads)");
  if (*hidden % *heads != 0)
    return Status::Invalid("num_attention_heads", "does not divide hidden_size = " + std::to_string(*hidden));
  return *hidden / *heads;
}

// The rotated dimensions: int(head_dim · partial_rotary_factor) (GPT-NeoX: rotary_pct).
Expected<std::int64_t> read_rotary_dim(const Reader& top, const std::string& mt, std::int64_t head_dim) {
  POSENC_TAKE(prf, top.positive("partial_rotary_factor"));
  POSENC_TAKE(rotary_pct, top.positive("rotary_pct"));
  double fraction = 1.0;
  const char* fraction_field = "partial_rotary_factor";
  if (rotary_pct) {
    if (!is_neox(mt))
      return Status::Invalid("rotary_pct", "read only for GPT-NeoX configs (model_type gpt_neox), this one is '" + mt + "'");
    if (prf && *prf != *rotary_pct)
      return Status::Invalid("partial_rotary_factor", "GPT-NeoX takes rotary_pct = " + num(*rotary_pct) +
                                                          ", but partial_rotary_factor says " + num(*prf));
    fraction = *rotary_pct;
    fraction_field = "rotary_pct";
  } else if (mt.rfind("gpt_neox", 0) == 0) {
    return Status::Invalid("rotary_pct", "missing (transformers would take GPTNeoXConfig's default 0.25; give it)");
  } else if (prf) {
    fraction = *prf;
  }
  if (fraction > 1) return Status::Invalid(fraction_field, "expected a fraction in (0, 1], got " + num(fraction));
  const double rd = std::trunc(static_cast<double>(head_dim) * fraction);  // Python's int(head_dim * f)
  const std::int64_t r = static_cast<std::int64_t>(rd);
  if (r < 2 || r % 2 != 0)
    return Status::Invalid(fraction_field, "gives int(" + std::to_string(head_dim) + " * " + num(fraction) + ") = " +
                                               std::to_string(r) + " rotated dimensions: expected an even number >= 2");
  return r;
}

// rope_scaling's scheme (rope_type, or type; renamed as Phi3Config and Qwen2VLConfig rename it), its
// mrope_section into out, and no field the scheme does not read. r: the rotated dimensions.
Expected<std::string> read_scheme(const json& sc, const Reader& rs, const std::string& mt, std::int64_t r,
                                  RopeModelConfig* out) {
  POSENC_TAKE(rope_type, rs.string("rope_type"));
  POSENC_TAKE(type, rs.string("type"));
  if (rope_type && type && *rope_type != *type)
    return Status::Invalid("rope_scaling.type", "says '" + *type + "' but rope_scaling.rope_type says '" + *rope_type + "'");
  if (!rope_type && !type) return Status::Invalid("rope_scaling.rope_type", "missing (or rope_scaling.type)");
  const char* type_field = rope_type ? "rope_scaling.rope_type" : "rope_scaling.type";
  std::string scheme = rope_type ? *rope_type : *type;
  if (mt == "phi3" && (scheme == "su" || scheme == "yarn")) {
    out->notes.push_back(std::string(type_field) + ": Phi3Config renames '" + scheme + "' to 'longrope'");
    scheme = "longrope";
  }
  // M-RoPE (Qwen2VLConfig): "mrope" is the default frequencies; mrope_section splits the pairs
  // among t, h, w (with any scheme: rotary.h's M-RoPE reads rope.h's frequencies).
  if (scheme == "mrope") {
    if (!rs.has("mrope_section"))
      return Status::Invalid("rope_scaling.mrope_section", "missing (rope_type mrope requires it: [s_t, s_h, s_w])");
    out->notes.push_back(std::string(type_field) + ": 'mrope' is the default frequencies split by mrope_section "
                         "(Qwen2VLConfig)");
    scheme = "default";
  }
  if (rs.has("mrope_section")) {
    const json& v = sc.at("mrope_section");
    const std::string want = "a list of three integers [s_t, s_h, s_w] >= 0 summing to r/2 = " + std::to_string(r / 2);
    if (!v.is_array() || v.size() != 3) return Status::Invalid("rope_scaling.mrope_section", "expected " + want +
                                                                                               ", got " + shown(v));
    std::int64_t sum = 0;
    for (const json& e : v) {
      if (!e.is_number_integer() || e.get<std::int64_t>() < 0 || e.get<std::int64_t>() > r)
        return Status::Invalid("rope_scaling.mrope_section", "expected " + want + ", got " + shown(v));
      out->mrope_section.push_back(e.get<std::int64_t>());
      sum += e.get<std::int64_t>();
    }
    if (sum != r / 2)
      return Status::Invalid("rope_scaling.mrope_section", "sums to " + std::to_string(sum) + ": expected " + want);
  }
  const auto fields = scheme_fields().find(scheme);
  if (fields == scheme_fields().end())
    return Status::Invalid(type_field, "unknown rope_type '" + scheme +
                                           "', expected default, linear, dynamic, yarn, llama3, longrope (or ntk)");
  for (const auto& [key, value] : sc.items()) {
    if (key == "rope_type" || key == "type" || key == "mrope_section") continue;
    if (!fields->second.count(key)) {
      std::string reads;
      for (const std::string& f : fields->second) reads += (reads.empty() ? "" : ", ") + f;
      return Status::Invalid("rope_scaling." + key, "not a field of rope_type " + scheme + " (it reads " +
                                                         (reads.empty() ? std::string("none") : reads) + ")");
    }
  }
  return scheme;
}

// What the schemes' readers share: rope_scaling, the scheme, the model type, the rotated dimensions,
// the fields several schemes read, and the top level's max_position_embeddings and
// original_max_position_embeddings.
struct Scaling {
  const Reader& rs;
  std::string scheme, mt;
  std::int64_t r = 0;
  std::optional<double> factor, attention_factor;
  std::optional<std::int64_t> sc_original, max_pos, top_original;

  Status need_factor(RopeParams* p) const {
    if (!factor) return Status::Invalid("rope_scaling.factor", "missing (rope_type " + scheme + " requires it)");
    p->factor = *factor;
    return Status::Ok();
  }
  Status need_max_pos(const std::string& why) const {
    if (!max_pos) return Status::Invalid("max_position_embeddings", "missing (" + why + ")");
    return Status::Ok();
  }
  std::string ignored_top() const {
    return "original_max_position_embeddings: not read by transformers 4.56's " + scheme + " scaling";
  }
};

Status read_yarn(const Scaling& s, RopeModelConfig* out) {
  RopeParams& p = out->params;
  POSENC_RETURN_IF_ERROR(s.need_factor(&p));
  if (s.sc_original) {
    p.original_max_position = *s.sc_original;
  } else {
    POSENC_RETURN_IF_ERROR(s.need_max_pos("yarn without rope_scaling.original_max_position_embeddings takes it"));
    p.original_max_position = *s.max_pos;
  }
  if (s.sc_original && s.max_pos) {
    const double implicit = static_cast<double>(*s.max_pos) / static_cast<double>(*s.sc_original);
    if (implicit != p.factor)
      out->notes.push_back("rope_scaling.factor = " + num(p.factor) +
                           " differs from max_position_embeddings / original_max_position_embeddings = " +
                           num(implicit) + ": transformers >= 4.56 uses the explicit factor (<= 4.55 used the ratio)");
  }
  POSENC_TAKE(beta_fast, s.rs.positive("beta_fast"));
  POSENC_TAKE(beta_slow, s.rs.positive("beta_slow"));
  POSENC_TAKE(mscale, s.rs.number("mscale"));
  POSENC_TAKE(mscale_all_dim, s.rs.number("mscale_all_dim"));
  POSENC_TAKE(truncate, s.rs.boolean("truncate"));
  p.beta_fast = beta_fast.value_or(32.0);
  p.beta_slow = beta_slow.value_or(1.0);
  p.mscale = mscale.value_or(0.0);
  p.mscale_all_dim = mscale_all_dim.value_or(0.0);
  p.truncate = truncate.value_or(true);
  if (s.attention_factor) p.attention_factor = *s.attention_factor;
  if (s.top_original) out->notes.push_back(s.ignored_top() + " (it reads rope_scaling.original_max_position_embeddings)");
  if (is_deepseek(s.mt) && p.mscale_all_dim != 0) {
    // DeepseekV3Attention: scaling = qk_head_dim^-0.5 · m(factor, mscale_all_dim)², not part of RoPE.
    const double m = p.factor <= 1 ? 1.0 : 0.1 * p.mscale_all_dim * std::log(p.factor) + 1.0;
    out->notes.push_back("DeepSeek's attention multiplies its softmax scale qk_head_dim^-0.5 by m(factor, "
                         "mscale_all_dim)^2 = " + num(m * m) + " (transformers' DeepseekV3Attention; not part of "
                         "RoPE: give it to posenc attention --scale), and rotates only the last qk_rope_head_dim "
                         "dimensions of q and k (q_pe, k_pe)");
  }
  return Status::Ok();
}

Status read_llama3(const Scaling& s, RopeModelConfig* out) {
  RopeParams& p = out->params;
  POSENC_RETURN_IF_ERROR(s.need_factor(&p));
  POSENC_TAKE(low, s.rs.positive("low_freq_factor"));
  POSENC_TAKE(high, s.rs.positive("high_freq_factor"));
  if (!low) return Status::Invalid("rope_scaling.low_freq_factor", "missing (rope_type llama3 requires it)");
  if (!high) return Status::Invalid("rope_scaling.high_freq_factor", "missing (rope_type llama3 requires it)");
  if (!(*high > *low))
    return Status::Invalid("rope_scaling.high_freq_factor", "expected a number > low_freq_factor = " + num(*low) +
                                                               ", got " + num(*high));
  if (!s.sc_original)
    return Status::Invalid("rope_scaling.original_max_position_embeddings", "missing (rope_type llama3 requires it)");
  p.low_freq_factor = *low;
  p.high_freq_factor = *high;
  p.original_max_position = *s.sc_original;
  if (s.top_original) out->notes.push_back(s.ignored_top() + " (it reads rope_scaling.original_max_position_embeddings)");
  return Status::Ok();
}

Status read_longrope(const Scaling& s, RopeModelConfig* out) {
  RopeParams& p = out->params;
  POSENC_TAKE(sf, s.rs.list("short_factor", s.r / 2));
  POSENC_TAKE(lf, s.rs.list("long_factor", s.r / 2));
  p.short_factor = std::move(sf);
  p.long_factor = std::move(lf);
  if (s.top_original) {
    POSENC_RETURN_IF_ERROR(s.need_max_pos("longrope's factor is max_position_embeddings / original_max_position_embeddings"));
    p.original_max_position = *s.top_original;
    p.factor = static_cast<double>(*s.max_pos) / static_cast<double>(*s.top_original);
    if (s.factor)
      out->notes.push_back("rope_scaling.factor: not read by transformers 4.56's longrope when the config has "
                           "original_max_position_embeddings (it takes max_position_embeddings / "
                           "original_max_position_embeddings = " + num(p.factor) + ")");
  } else {
    POSENC_RETURN_IF_ERROR(s.need_max_pos("longrope without original_max_position_embeddings switches there"));
    p.original_max_position = *s.max_pos;
    if (!s.factor)
      return Status::Invalid("rope_scaling.factor", "missing (longrope's attention factor needs it when the config "
                                                    "has no top-level original_max_position_embeddings)");
    p.factor = *s.factor;
  }
  if (s.sc_original)
    out->notes.push_back("rope_scaling.original_max_position_embeddings: not read by transformers 4.56's longrope "
                         "(it reads the top-level original_max_position_embeddings)");
  if (s.attention_factor) p.attention_factor = *s.attention_factor;
  return Status::Ok();
}

// The scheme's fields of rope_scaling into out->params (and notes on fields transformers ignores).
Status read_scaling(const Scaling& s, RopeModelConfig* out) {
  RopeParams& p = out->params;
  p.rope_type = parse_rope_type(s.scheme).value();
  switch (p.rope_type) {
    case RopeType::kDefault:
      if (s.top_original) out->notes.push_back(s.ignored_top());
      return Status::Ok();
    case RopeType::kLinear:
    case RopeType::kNtk:
      POSENC_RETURN_IF_ERROR(s.need_factor(&p));
      if (s.top_original) out->notes.push_back(s.ignored_top());
      return Status::Ok();
    case RopeType::kDynamic:
      POSENC_RETURN_IF_ERROR(s.need_factor(&p));
      POSENC_RETURN_IF_ERROR(s.need_max_pos("dynamic NTK's window is max_position_embeddings"));
      p.original_max_position = *s.max_pos;
      if (s.sc_original)
        out->notes.push_back("rope_scaling.original_max_position_embeddings: not read by transformers 4.56's dynamic "
                             "scaling (its window is max_position_embeddings = " + std::to_string(*s.max_pos) + ")");
      if (s.top_original) out->notes.push_back(s.ignored_top());
      return Status::Ok();
    case RopeType::kYarn: return read_yarn(s, out);
    case RopeType::kLlama3: return read_llama3(s, out);
    case RopeType::kLongrope: return read_longrope(s, out);
  }
  return Status::Ok();
}

}  // namespace

Expected<RopeModelConfig> rope_config_from_json(const std::string& text) {
  POSENC_TAKE(j, parse_config(text));
  const Reader top{j, ""};
  RopeModelConfig out;
  RopeParams& p = out.params;
  POSENC_TAKE(model_type, top.string("model_type"));
  out.model_type = model_type.value_or("");
  const std::string& mt = out.model_type;
  POSENC_RETURN_IF_ERROR(check_top(j, top, mt));
  POSENC_TAKE(theta, read_theta(top, mt));
  p.theta = theta;
  POSENC_TAKE(head_dim, read_head_dim(top, mt));
  out.head_dim = head_dim;
  POSENC_TAKE(r, read_rotary_dim(top, mt, head_dim));
  p.rotary_dim = r;
  // layout: transformers rotates halves (rotate_half) but for DeepSeek's interleaved pairs
  POSENC_TAKE(interleave, top.boolean("rope_interleave"));
  const bool interleaved = interleave ? *interleave : is_deepseek(mt);
  p.layout = interleaved ? RopeLayout::kInterleaved : RopeLayout::kHalf;
  POSENC_TAKE(max_pos, top.integer("max_position_embeddings"));
  out.max_position_embeddings = max_pos.value_or(0);
  POSENC_TAKE(top_original, top.integer("original_max_position_embeddings"));
  if (!top.has("rope_scaling")) {
    if (top_original) out.notes.push_back("original_max_position_embeddings: not read by the default scheme");
    return out;
  }
  const json& sc = j.at("rope_scaling");
  if (!sc.is_object()) return Status::Invalid("rope_scaling", "expected an object or null, got " + shown(sc));
  const Reader rs{sc, "rope_scaling."};
  POSENC_TAKE(scheme, read_scheme(sc, rs, mt, r, &out));
  POSENC_TAKE(factor, rs.positive("factor"));
  POSENC_TAKE(sc_original, rs.integer("original_max_position_embeddings"));
  POSENC_TAKE(attention_factor, rs.positive("attention_factor"));
  const Scaling s{rs, scheme, mt, r, factor, attention_factor, sc_original, max_pos, top_original};
  POSENC_RETURN_IF_ERROR(read_scaling(s, &out));
  return out;
}

}  // namespace posenc
