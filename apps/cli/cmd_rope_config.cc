// posenc rope-config CONFIG.json [--seq-len N]
// The RoPE a Hugging Face config.json describes, as transformers (>= 4.56) computes it: one JSON
// object on stdout with the scheme and its parameters, the rotary dimension, the inverse
// frequencies inv_freq (double, the accurate values) and inv_freq_hf (the float32 values of
// transformers' own float32 computation, which --angles hf uses), and the attention factor that
// multiplies cos and sin. --seq-len is the call's length for the schemes that depend on it
// (dynamic beyond its window, longrope's short/long switch); without it they take transformers'
// values at initialisation (dynamic: the window itself; longrope: the short factors). An M-RoPE
// config (Qwen2-VL) adds its mrope_section [s_t, s_h, s_w]. A model without RoPE (BERT, GPT-2) is
// the error "CONFIG: this model has no rotary embedding (model_type bert)".
// Errors name the config field ("rope_scaling.factor") on one stderr line; nothing is printed then.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/cli_common.h"

namespace posenc::cli {

namespace {

struct RopeConfigState {
  std::string path, seq_len = "0";
};

void run_rope_config(RopeConfigState& st) {
  const std::int64_t n = parse_int("--seq-len", st.seq_len);
  if (n < 0) fail(Status::Invalid("--seq-len", "expected a length >= 0 (0: none), got " + std::to_string(n)));
  const RopeModelConfig c = read_rope_config("CONFIG", st.path);
  if (c.head_dim > (std::int64_t{1} << 20))
    fail(Status::OutOfRange("CONFIG", "expected a head dimension <= 2^20 (1048576), got " +
                                          std::to_string(c.head_dim) + " (in " + st.path + ")"));
  RopeParams p = c.params;
  p.seq_len = n;
  auto fr = rope_frequencies(p, c.head_dim, 0);
  if (!fr.ok()) fail(Status::Invalid("CONFIG", fr.status().message() + " (in " + st.path + ")"));
  {  // inv_freq_hf is printed too: transformers' float32 frequencies must be finite as well
    RopeParams hf = p;
    hf.angles = RopeAngles::kHf;
    if (auto fh = rope_frequencies(hf, c.head_dim, 0); !fh.ok())
      fail(Status::Invalid("CONFIG", fh.status().message() + " (inv_freq_hf, in " + st.path + ")"));
  }
  const RopeFrequencies& f = *fr;

  nlohmann::json o;
  o["model_type"] = c.model_type.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.model_type);
  o["rope_type"] = rope_type_name(p.rope_type);
  o["layout"] = rope_layout_name(p.layout);
  o["head_dim"] = c.head_dim;
  o["rotary_dim"] = f.rotary_dim;
  o["theta"] = p.theta;
  o["max_position_embeddings"] = c.max_position_embeddings ? nlohmann::json(c.max_position_embeddings) : nlohmann::json(nullptr);
  o["seq_len"] = n ? nlohmann::json(n) : nlohmann::json(nullptr);
  if (p.rope_type != RopeType::kDefault) o["factor"] = p.factor;
  if (p.original_max_position) o["original_max_position"] = p.original_max_position;
  switch (p.rope_type) {
    case RopeType::kNtk:
    case RopeType::kDynamic:
      o["scaled_theta"] = f.theta;
      break;
    case RopeType::kYarn:
      o["beta_fast"] = p.beta_fast;
      o["beta_slow"] = p.beta_slow;
      o["truncate"] = p.truncate;
      o["mscale"] = p.mscale;
      o["mscale_all_dim"] = p.mscale_all_dim;
      break;
    case RopeType::kLlama3:
      o["low_freq_factor"] = p.low_freq_factor;
      o["high_freq_factor"] = p.high_freq_factor;
      break;
    case RopeType::kLongrope:
      o["longrope_factors"] = f.long_factors ? "long" : "short";
      break;
    default:
      break;
  }
  if (!c.mrope_section.empty()) o["mrope_section"] = c.mrope_section;  // M-RoPE (Qwen2-VL): posenc apply mrope --config
  o["attention_factor"] = f.attention_factor;
  o["inv_freq"] = f.inv_freq;
  o["inv_freq_hf"] = f.inv_freq_f32;
  o["notes"] = c.notes;
  std::printf("%s\n", o.dump(2).c_str());
}

}  // namespace

Command add_rope_config_command(CLI::App& root) {
  auto st = std::make_shared<RopeConfigState>();
  CLI::App* app = root.add_subcommand(
      "rope-config", "print the RoPE of a Hugging Face config.json as JSON: rope_type, rotary_dim, theta, "
                     "inv_freq, attention_factor (transformers >= 4.56 semantics)");
  app->allow_extras();
  app->add_option("CONFIG", st->path, "the model's config.json")->required()->type_name("CONFIG.json");
  add_text(app, "--seq-len", &st->seq_len,
           "the call's length (max position + 1) for dynamic and longrope (default: none, their initial values)",
           "INT");
  return {app, [st] { run_rope_config(*st); }};
}

}  // namespace posenc::cli
