#include "core/param_text.h"

#include "attention/attention_check.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>

namespace posenc::text {

Expected<std::int64_t> parse_int(const std::string& arg, const std::string& text) {
  std::int64_t v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (first != last && *first == '+') ++first;
  const auto [ptr, ec] = std::from_chars(first, last, v);
  if (text.empty() || ec != std::errc() || ptr != last)
    return Status::Invalid(arg, "expected an integer, got '" + text + "'");
  return v;
}

Expected<double> parse_float(const std::string& arg, const std::string& text) {
  char* end = nullptr;
  // no leading space either (strtod skips it; the integers' from_chars does not)
  const bool bad = text.empty() || std::isspace(static_cast<unsigned char>(text[0]));
  const double v = bad ? 0.0 : std::strtod(text.c_str(), &end);
  if (bad || end != text.c_str() + text.size() || !std::isfinite(v))
    return Status::Invalid(arg, "expected a finite number, got '" + text + "'");
  return v;
}

Expected<bool> parse_bool(const std::string& arg, const std::string& text) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  return Status::Invalid(arg, "expected true or false (or 1/0, yes/no, on/off), got '" + text + "'");
}

namespace {

// Splits "a,b,c" and parses each piece with `one`; an empty text is an empty list.
template <class T, class F>
Expected<std::vector<T>> parse_list(const std::string& arg, const std::string& text, F one) {
  std::vector<T> out;
  if (text.empty()) return out;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    auto v = one(arg, text.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (!v.ok()) return v.status();
    out.push_back(*v);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

template <class T>
Status assign(Expected<T> v, T* field) {
  if (!v.ok()) return v.status();
  *field = std::move(v).value();
  return Status::Ok();
}

// The same for a field whose default is "absent" (attention_factor, scale, q_offset, center).
template <class T>
Status assign(Expected<T> v, std::optional<T>* field) {
  if (!v.ok()) return v.status();
  *field = std::move(v).value();
  return Status::Ok();
}

// RoPE's per-pair lists: registry parameters of type tensor that the vocabulary takes as text keys.
bool is_rope_list(const std::string& key) {
  return key == "short_factor" || key == "long_factor" || key == "freq_factors" || key == "inv_freq";
}

}  // namespace

Expected<std::vector<double>> parse_floats(const std::string& arg, const std::string& text) {
  return parse_list<double>(arg, text, parse_float);
}

Expected<std::vector<std::int64_t>> parse_ints(const std::string& arg, const std::string& text) {
  return parse_list<std::int64_t>(arg, text, parse_int);
}

std::string key_name(const std::string& key) {
  std::string k = key;
  for (char& c : k)
    if (c == '-') c = '_';
  return k;
}

namespace {

using RopeSetter = std::function<Status(RopeParams*, const std::string&, const std::string&)>;

const std::vector<std::pair<std::string, RopeSetter>>& rope_setters() {
  static const std::vector<std::pair<std::string, RopeSetter>> s = {
      {"layout", [](RopeParams* p, auto&, auto& v) { return assign(parse_rope_layout(v), &p->layout); }},
      {"rotary_dim", [](RopeParams* p, auto& k, auto& v) { return assign(parse_int(k, v), &p->rotary_dim); }},
      {"theta", [](RopeParams* p, auto& k, auto& v) { return assign(parse_float(k, v), &p->theta); }},
      {"rope_type", [](RopeParams* p, auto&, auto& v) { return assign(parse_rope_type(v), &p->rope_type); }},
      {"factor", [](RopeParams* p, auto& k, auto& v) { return assign(parse_float(k, v), &p->factor); }},
      {"original_max_position",
       [](RopeParams* p, auto& k, auto& v) { return assign(parse_int(k, v), &p->original_max_position); }},
      {"beta_fast", [](RopeParams* p, auto& k, auto& v) { return assign(parse_float(k, v), &p->beta_fast); }},
      {"beta_slow", [](RopeParams* p, auto& k, auto& v) { return assign(parse_float(k, v), &p->beta_slow); }},
      {"truncate", [](RopeParams* p, auto& k, auto& v) { return assign(parse_bool(k, v), &p->truncate); }},
      {"mscale", [](RopeParams* p, auto& k, auto& v) { return assign(parse_float(k, v), &p->mscale); }},
      {"mscale_all_dim",
       [](RopeParams* p, auto& k, auto& v) { return assign(parse_float(k, v), &p->mscale_all_dim); }},
      {"low_freq_factor",
       [](RopeParams* p, auto& k, auto& v) { return assign(parse_float(k, v), &p->low_freq_factor); }},
      {"high_freq_factor",
       [](RopeParams* p, auto& k, auto& v) { return assign(parse_float(k, v), &p->high_freq_factor); }},
      {"short_factor", [](RopeParams* p, auto& k, auto& v) { return assign(parse_floats(k, v), &p->short_factor); }},
      {"long_factor", [](RopeParams* p, auto& k, auto& v) { return assign(parse_floats(k, v), &p->long_factor); }},
      {"longrope_factors",
       [](RopeParams* p, auto&, auto& v) { return assign(parse_longrope_factors(v), &p->longrope_factors); }},
      {"attention_factor",
       [](RopeParams* p, auto& k, auto& v) { return assign(parse_float(k, v), &p->attention_factor); }},
      {"freq_factors", [](RopeParams* p, auto& k, auto& v) { return assign(parse_floats(k, v), &p->freq_factors); }},
      {"inv_freq", [](RopeParams* p, auto& k, auto& v) { return assign(parse_floats(k, v), &p->inv_freq); }},
      {"angles", [](RopeParams* p, auto&, auto& v) { return assign(parse_rope_angles(v), &p->angles); }},
      {"seq_len", [](RopeParams* p, auto& k, auto& v) { return assign(parse_int(k, v), &p->seq_len); }},
  };
  return s;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

const std::vector<std::string>& rope_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& [name, set] : rope_setters()) k.push_back(name);
    return k;
  }();
  return keys;
}

Status set_rope_param(RopeParams* p, const std::string& key_in, const std::string& value) {
  const std::string key = key_name(key_in);
  for (const auto& [name, set] : rope_setters()) {
    if (name != key) continue;
    RopeParams next = *p;
    Status s = set(&next, key, value);
    // The parse_* of rope.h name no argument: name the key.
    if (!s.ok()) return s.arg().empty() || s.arg() != key ? Status::Invalid(key, s.what()) : s;
    *p = std::move(next);
    return Status::Ok();
  }
  return Status::Invalid(key, "unknown RoPE key, expected one of: " + joined(rope_keys()));
}

namespace {

// The RoPE parameters an encoding reads through all of RoPE's keys (rope, mrope, xpos; rope2d takes
// only layout, rotary_dim and theta, set_own's), else null.
RopeParams* rope_keys_of(AttentionParams* p) {
  return p->encoding == Encoding::kRope2d ? nullptr : attn::rope_of(*p);
}

// The encoding's own (non-RoPE) keys and how each is set.
Status set_own(AttentionParams* p, const std::string& k, const std::string& v, bool* known) {
  *known = true;
  switch (p->encoding) {
    case Encoding::kAlibi:
      if (k == "variant") return assign(parse_alibi_variant(v), &p->alibi.variant);
      break;
    case Encoding::kT5:
      if (k == "bidirectional") return assign(parse_bool(k, v), &p->t5.bidirectional);
      if (k == "num_buckets") return assign(parse_int(k, v), &p->t5.num_buckets);
      if (k == "max_distance") return assign(parse_int(k, v), &p->t5.max_distance);
      break;
    case Encoding::kKerple:
      if (k == "kernel") return assign(parse_kerple_kernel(v), &p->kerple.kernel);
      break;
    case Encoding::kSandwich:
      if (k == "sinusoid_dim") return assign(parse_int(k, v), &p->sandwich.sinusoid_dim);
      if (k == "base") return assign(parse_float(k, v), &p->sandwich.base);
      break;
    case Encoding::kRope2d:
      if (k == "variant") return assign(parse_rope2d_variant(v), &p->rope2d.variant);
      if (k == "layout" || k == "rotary_dim" || k == "theta") return set_rope_param(&p->rope2d.rope, k, v);
      break;
    case Encoding::kMrope:
      if (k == "variant") return assign(parse_mrope_variant(v), &p->mrope.variant);
      if (k == "mrope_section") return assign(parse_ints(k, v), &p->mrope.mrope_section);
      break;
    case Encoding::kXpos:
      if (k == "scale_base") return assign(parse_float(k, v), &p->xpos.scale_base);
      if (k == "gamma") return assign(parse_float(k, v), &p->xpos.gamma);
      if (k == "center") return assign(parse_int(k, v), &p->xpos.center);
      break;
    default: break;
  }
  *known = false;
  return Status::Ok();
}

// Every key set_attention_param (call_keys) or set_encoding_param (not) takes for p's encoding, for
// the error of an unknown one.
std::string known_keys(const AttentionParams& p, bool call_keys) {
  std::vector<std::string> keys;
  if (call_keys) keys = {"causal", "scale", "q_offset", "k_offset", "keys_rotated", "bf16_rate"};
  for (const ParamSpec& s : encoding_info(p.encoding).params)
    if ((s.type != "tensor" && s.type != "file") || is_rope_list(key_name(s.name))) keys.push_back(key_name(s.name));
  return joined(keys);
}

// The encoding's own key k into next (*known false when it has none of that name).
Status set_encoding_key(AttentionParams* next, const std::string& k, const std::string& value, bool* known) {
  Status s = set_own(next, k, value, known);
  if (!*known && rope_keys_of(next) != nullptr) {
    const auto& rk = rope_keys();
    *known = std::find(rk.begin(), rk.end(), k) != rk.end();
    if (*known) s = set_rope_param(rope_keys_of(next), k, value);
  }
  return s;
}

// The end of both setters: an unknown key's error, or a value's error named after the key, or next
// taken into p.
Status finish_set(AttentionParams* p, AttentionParams&& next, const std::string& k, const Status& s, bool known,
                  bool call_keys) {
  if (!known)
    return Status::Invalid(k, std::string("unknown key for ") + encoding_info(p->encoding).name +
                                  ", expected one of: " + known_keys(*p, call_keys));
  if (!s.ok()) return s.arg() == k ? s : Status::Invalid(k, s.what());
  *p = std::move(next);
  return Status::Ok();
}

}  // namespace

Status set_attention_param(AttentionParams* p, const std::string& key_in, const std::string& value) {
  const std::string k = key_name(key_in);
  AttentionParams next = *p;
  Status s;
  bool known = true;
  if (k == "causal") {
    s = assign(parse_bool(k, value), &next.causal);
  } else if (k == "scale") {
    s = assign(parse_float(k, value), &next.scale);
  } else if (k == "q_offset") {
    s = assign(parse_int(k, value), &next.q_offset);
  } else if (k == "k_offset") {
    s = assign(parse_int(k, value), &next.k_offset);
  } else if (k == "keys_rotated") {
    s = assign(parse_bool(k, value), &next.keys_rotated);
  } else if (k == "bf16_rate") {
    s = assign(parse_bool(k, value), &next.bf16_rate);
  } else {
    s = set_encoding_key(&next, k, value, &known);
  }
  return finish_set(p, std::move(next), k, s, known, true);
}

Status set_encoding_param(AttentionParams* p, const std::string& key_in, const std::string& value) {
  const std::string k = key_name(key_in);
  AttentionParams next = *p;
  bool known = true;
  const Status s = set_encoding_key(&next, k, value, &known);
  return finish_set(p, std::move(next), k, s, known, false);
}

namespace {

// Registry name → member of a tensor set (EncodingTensors or EncodingGrads share these names).
template <class Set>
View* member(Set* t, const std::string& n) {
  if (n == "weights") return &t->weights;
  if (n == "u") return &t->u;
  if (n == "v_bias") return &t->v;
  if (n == "rel_proj") return &t->rel_proj;
  if (n == "table") return &t->table;
  if (n == "r1") return &t->r1;
  if (n == "r2") return &t->r2;
  if (n == "mlp_w1") return &t->fire.w1;
  if (n == "mlp_b1") return &t->fire.b1;
  if (n == "mlp_w2") return &t->fire.w2;
  if (n == "mlp_b2") return &t->fire.b2;
  if (n == "c") return &t->fire.c;
  if (n == "threshold") return &t->fire.threshold;
  if (n == "freqs") return &t->freqs;
  return nullptr;
}

// The encoding's tensor names (learned ones only for gradients); RoPE's lists are keys, not tensors.
std::vector<std::string> tensor_names(Encoding enc, bool grads) {
  std::vector<std::string> out;
  for (const ParamSpec& s : encoding_info(enc).params)
    if (s.type == "tensor" && (!grads || s.learned) && !is_rope_list(key_name(s.name)))
      out.push_back(key_name(s.name));
  if (!grads && (enc == Encoding::kRope2d || enc == Encoding::kMrope)) {
    out.push_back("q_positions");
    out.push_back("k_positions");
  }
  return out;
}

Status unknown_tensor(Encoding enc, const std::string& n, bool grads) {
  const std::vector<std::string> names = tensor_names(enc, grads);
  const std::string what = std::string(grads ? "no gradient of that name for " : "no tensor of that name for ") +
                           encoding_info(enc).name;
  return Status::Invalid(n, names.empty() ? what + " (it has none)" : what + ", expected one of: " + joined(names));
}

}  // namespace

Expected<View*> encoding_tensor(Encoding enc, EncodingTensors* t, const std::string& name) {
  const std::string n = key_name(name);
  const std::vector<std::string> names = tensor_names(enc, false);
  if (std::find(names.begin(), names.end(), n) == names.end()) return unknown_tensor(enc, n, false);
  if (n == "slopes") return &t->slopes;
  if (n == "q_positions") return &t->q_positions;
  if (n == "k_positions") return &t->k_positions;
  View* v = member(t, n);
  if (v == nullptr) return Status::Internal("encoding tensor " + n + " has no field");
  return v;
}

Expected<View*> encoding_grad(Encoding enc, EncodingGrads* g, const std::string& name) {
  const std::string n = key_name(name);
  const std::vector<std::string> names = tensor_names(enc, true);
  if (std::find(names.begin(), names.end(), n) == names.end()) return unknown_tensor(enc, n, true);
  View* v = member(g, n);
  if (v == nullptr) return Status::Internal("encoding gradient " + n + " has no field");
  return v;
}

}  // namespace posenc::text
