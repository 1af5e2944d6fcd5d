// The per-encoding glue of the CLI (cli_common.h): each encoding's parameter struct and tensors from
// its flags, RoPE's from a Hugging Face config.json, positions from .npy files.
#include <filesystem>
#include <fstream>

#include "cli/cli_common.h"
#include "core/param_text.h"

namespace posenc::cli {

RopeModelConfig read_rope_config(const std::string& flag, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    fail(Status::Io(flag, "'" + path + "' is a directory, expected a config.json file"));
  note_input(path, flag);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Status::Io(flag, "cannot open '" + path + "'"));
  // At most 16 MiB (a config.json is a few KB): a device or pipe without end would grow without bound.
  constexpr std::size_t kMaxConfig = std::size_t{1} << 24;
  std::string text(kMaxConfig + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) fail(Status::Io(flag, "cannot read '" + path + "'"));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxConfig) fail(Status::OutOfRange(flag, "'" + path + "' is over 16 MiB: not a config.json"));
  auto c = rope_config_from_json(text);
  if (!c.ok())  // "config" names the file as a whole: the flag says it
    fail(Status::Invalid(flag, (c.status().arg() == "config" ? c.status().what() : c.status().message()) + " (in " +
                                   path + ")"));
  return std::move(c).value();
}

namespace {

std::vector<double> rope_list(const ParamFlags& f, const std::string& name) {
  const Tensor* t = f.tensor(name);
  if (t == nullptr) return {};
  if (t->shape().size() != 1)
    fail(Status::Invalid("--" + name, "expected a 1-D array [r/2], got shape " + t->shape_str()));
  if (t->numel() == 0)  // an empty list would read as no list at all
    fail(Status::Invalid("--" + name, "expected a 1-D array [r/2], got an empty one"));
  return to_doubles(t->view());
}

}  // namespace

RopeParams rope_params(const ParamFlags& f, std::int64_t* config_head_dim) {
  RopeParams p;
  if (config_head_dim) *config_head_dim = 0;
  if (f.given("config")) {
    for (const char* name : {"rotary-dim", "theta", "rope-type", "factor", "original-max-position", "beta-fast",
                             "beta-slow", "truncate", "mscale", "mscale-all-dim", "low-freq-factor",
                             "high-freq-factor", "short-factor", "long-factor", "attention-factor",
                             "freq-factors", "inv-freq"})
      if (f.given(name))
        fail(Status::Invalid(std::string("--") + name, "cannot be combined with --config (the config sets the "
                                                       "RoPE parameters)"));
    const RopeModelConfig c = read_rope_config("--config", f.text_of("config"));
    p = c.params;
    if (config_head_dim) *config_head_dim = c.head_dim;
    if (f.given("layout")) p.layout = take(parse_rope_layout(f.choice("layout")));
  } else {
    p.layout = take(parse_rope_layout(f.choice("layout")));
    p.rotary_dim = f.i64("rotary-dim");
    p.theta = f.f64("theta");
    p.rope_type = take(parse_rope_type(f.choice("rope-type")));
    p.factor = f.f64("factor");
    p.original_max_position = f.i64("original-max-position");
    p.beta_fast = f.f64("beta-fast");
    p.beta_slow = f.f64("beta-slow");
    p.truncate = f.boolean("truncate");
    p.mscale = f.f64("mscale");
    p.mscale_all_dim = f.f64("mscale-all-dim");
    p.low_freq_factor = f.f64("low-freq-factor");
    p.high_freq_factor = f.f64("high-freq-factor");
    p.short_factor = rope_list(f, "short-factor");
    p.long_factor = rope_list(f, "long-factor");
    if (f.given("attention-factor")) p.attention_factor = f.f64("attention-factor");
    p.freq_factors = rope_list(f, "freq-factors");
    p.inv_freq = rope_list(f, "inv-freq");
    if (!p.inv_freq.empty() && f.given("theta"))  // the frequencies come outright: theta would be ignored
      fail(Status::Invalid("--theta", "not read with --inv-freq, which gives the frequencies outright; leave one out"));
  }
  p.longrope_factors = take(parse_longrope_factors(f.choice("longrope-factors")));
  p.angles = take(parse_rope_angles(f.choice("angles")));
  p.seq_len = f.i64("seq-len");
  return p;
}

FlagMap rope_names(const ParamFlags& f, const std::string& dim_flag) {
  FlagMap names;
  if (f.given("config")) {
    // Every parameter the config sets (rope_params refuses these flags beside --config).
    for (const char* name : {"rotary_dim", "theta", "rope_type", "factor", "original_max_position", "beta_fast",
                             "beta_slow", "truncate", "mscale", "mscale_all_dim", "low_freq_factor",
                             "high_freq_factor", "short_factor", "long_factor", "attention_factor",
                             "freq_factors", "inv_freq"})
      names.emplace_back(name, "--config");
  } else if (!f.given("rotary-dim")) {
    names.emplace_back("rotary_dim", dim_flag);
  }
  return names;
}

std::vector<std::int64_t> parse_ints(const std::string& flag, const std::string& text) {
  std::vector<std::int64_t> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    out.push_back(parse_int(flag, text.substr(at, comma == std::string::npos ? std::string::npos : comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

Tensor read_positions(const std::string& flag, const std::string& path) {
  Tensor t = read_input(flag, path);
  if (!is_int(t.dtype()))
    fail(Status::Invalid(flag, std::string("expected int32 or int64 positions, got ") + dtype_name(t.dtype())));
  return t;
}

Rope2dParams rope2d_params(const ParamFlags& f) {
  Rope2dParams p;
  p.variant = take(parse_rope2d_variant(f.choice("variant")));
  p.rope.layout = take(parse_rope_layout(f.choice("layout")));
  p.rope.rotary_dim = f.i64("rotary-dim");
  // The authors' bases: 100 for RoPE-Axial, 10 for RoPE-Mixed's initialisation.
  p.rope.theta = f.given("theta") ? f.f64("theta") : p.variant == Rope2dVariant::kMixed ? 10.0 : 100.0;
  if (p.variant == Rope2dVariant::kMixed && f.given("theta") && f.given("freqs"))  // mixed reads --freqs only
    fail(Status::Invalid("--theta", "not read by rope2d mixed, whose frequencies are --freqs (theta sets only their "
                                    "initialisation: posenc table rope2d --variant mixed --part init)"));
  return p;
}

MropeParams mrope_params(const ParamFlags& f, std::int64_t* config_head_dim) {
  MropeParams p;
  p.variant = take(parse_mrope_variant(f.choice("variant")));
  if (f.given("config")) {  // the section and the frequencies from the config, as rope's --config
    if (f.given("mrope-section"))
      fail(Status::Invalid("--mrope-section", "cannot be combined with --config (the config sets "
                                              "rope_scaling.mrope_section)"));
    const RopeModelConfig c = read_rope_config("--config", f.text_of("config"));
    if (c.mrope_section.empty())
      fail(Status::Invalid("--config", "has no rope_scaling.mrope_section: not an M-RoPE model (model_type " +
                                           (c.model_type.empty() ? std::string("absent") : c.model_type) + ", in " +
                                           f.text_of("config") + ")"));
    p.mrope_section = c.mrope_section;
  } else {
    if (!f.given("mrope-section"))
      fail(Status::Invalid("--mrope-section", "is required for mrope: three sizes s_t,s_h,s_w summing to r/2 "
                                              "(Qwen2-VL: 16,24,24 for r = 128), or --config"));
    p.mrope_section = parse_ints("--mrope-section", f.text_of("mrope-section"));
  }
  p.rope = rope_params(f, config_head_dim);
  return p;
}

XposParams xpos_params(const ParamFlags& f) {
  XposParams p;
  p.scale_base = f.f64("scale-base");
  p.gamma = f.f64("gamma");
  if (f.given("center")) p.center = f.i64("center");
  p.rope = rope_params(f);
  return p;
}

AlibiParams alibi_params(const ParamFlags& f) {
  AlibiParams p;
  p.variant = take(parse_alibi_variant(f.choice("variant")));
  return p;
}

T5Params t5_params(const ParamFlags& f) {
  T5Params p;
  p.bidirectional = f.boolean("bidirectional");
  p.num_buckets = f.i64("num-buckets");
  p.max_distance = f.i64("max-distance");
  return p;
}

KerpleParams kerple_params(const ParamFlags& f) {
  KerpleParams p;
  p.kernel = take(parse_kerple_kernel(f.choice("kernel")));
  return p;
}

SandwichParams sandwich_params(const ParamFlags& f) {
  SandwichParams p;
  p.sinusoid_dim = f.i64("sinusoid-dim");
  p.base = f.f64("base");
  return p;
}

namespace {

// The bound encoding's tensors, each read through `get` (ParamFlags::view or grad_view) into the
// slot the library names for it (`slot`: text::encoding_tensor or encoding_grad, the C ABI's too).
// RoPE's lists, tensor-typed flags that are parameters rather than tensors, have no slot.
template <class Set>
Set tensor_set(const ParamFlags& f, View (ParamFlags::*get)(const std::string&) const,
               Expected<View*> (*slot)(Encoding, Set*, const std::string&)) {
  Set set;
  for (const ParamSpec& spec : f.enc().params) {
    if (spec.type != "tensor") continue;
    const View v = (f.*get)(spec.name);
    if (!v.present()) continue;
    const Expected<View*> at = slot(f.enc().id, &set, spec.name);
    if (at.ok()) **at = v;
  }
  return set;
}

}  // namespace

SinusoidalParams sinusoidal_params(const ParamFlags& f) {
  SinusoidalParams p;
  p.base = f.f64("base");
  return p;
}

EncodingTensors encoding_tensors(const ParamFlags& f) {
  return tensor_set<EncodingTensors>(f, &ParamFlags::view, &posenc::text::encoding_tensor);
}

EncodingGrads encoding_grads(const ParamFlags& f) {
  return tensor_set<EncodingGrads>(f, &ParamFlags::grad_view, &posenc::text::encoding_grad);
}

}  // namespace posenc::cli
