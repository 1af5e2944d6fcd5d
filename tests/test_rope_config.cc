// RoPE's parameters and Hugging Face config.json reading: bad parameters name their field; the
// reader's schemes, sections and attention factors on hand-checked released models' configs; bad
// configs name the field. The config reader is also checked against a float32 re-implementation of
// transformers in tests/e2e/test_rope_config.py.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "posenc/reference.h"
#include "posenc/rope.h"
#include "testing.h"

namespace posenc {
namespace {

using testing::randn;
using testing::V;
using I = std::int64_t;
using Vec = std::vector<double>;

RopeFrequencies freqs(const RopeParams& p, I D, I call_len = 0) {
  auto f = rope_frequencies(p, D, call_len);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f.ok() ? *f : RopeFrequencies{};
}

// ---- errors ------------------------------------------------------------------------------------

TEST(RopeSchemes, BadParametersNameTheField) {
  const I B = 1, L = 2, H = 1, D = 8;
  Vec x = randn(B * L * H * D, 46), y(x.size(), 8.0);
  const View xv = V(x, {B, L, H, D}), yv = V(y, {B, L, H, D});
  auto expect_error = [&](const RopeParams& p, const char* arg) {
    const Status s = reference::rope_forward(p, xv, {}, yv);
    EXPECT_FALSE(s.ok()) << arg;
    EXPECT_EQ(s.arg(), arg) << s.message();
    EXPECT_EQ(y, Vec(y.size(), 8.0)) << "output written on error: " << s.message();
    EXPECT_EQ(rope_forward(p, xv, {}, yv).message(), s.message());  // the fast dispatcher agrees
  };
  auto with = [](auto f) {
    RopeParams p;
    f(p);
    return p;
  };
  expect_error(with([](RopeParams& p) { p.factor = 2; }), "factor");  // default does not read it
  expect_error(with([](RopeParams& p) { p.rope_type = RopeType::kLinear; p.factor = 0; }), "factor");
  expect_error(with([](RopeParams& p) { p.rope_type = RopeType::kLinear; p.factor = NAN; }), "factor");
  expect_error(with([](RopeParams& p) { p.rope_type = RopeType::kYarn; p.factor = 2; }), "original_max_position");
  expect_error(with([](RopeParams& p) { p.original_max_position = 5; }), "original_max_position");
  expect_error(with([](RopeParams& p) { p.rope_type = RopeType::kYarn; p.factor = 2; p.original_max_position = 9; p.beta_fast = 0; }), "beta_fast");
  expect_error(with([](RopeParams& p) { p.rope_type = RopeType::kYarn; p.factor = 2; p.original_max_position = 9; p.beta_slow = -1; }), "beta_slow");
  expect_error(with([](RopeParams& p) { p.rope_type = RopeType::kYarn; p.factor = 2; p.original_max_position = 9; p.mscale = INFINITY; }), "mscale");
  expect_error(with([](RopeParams& p) { p.beta_fast = 16; }), "beta_fast");
  expect_error(with([](RopeParams& p) { p.truncate = false; }), "truncate");
  expect_error(with([](RopeParams& p) { p.mscale_all_dim = 1; }), "mscale_all_dim");
  expect_error(with([](RopeParams& p) { p.rope_type = RopeType::kLlama3; p.factor = 8; p.original_max_position = 9; p.high_freq_factor = 1; }), "high_freq_factor");
  expect_error(with([](RopeParams& p) { p.rope_type = RopeType::kLlama3; p.factor = 8; p.original_max_position = 9; p.low_freq_factor = 0; }), "low_freq_factor");
  expect_error(with([](RopeParams& p) { p.low_freq_factor = 2; }), "low_freq_factor");
  expect_error(with([](RopeParams& p) { p.rope_type = RopeType::kLongrope; p.original_max_position = 9; p.short_factor = {1, 1, 1}; p.long_factor = {1, 1, 1, 1}; }), "short_factor");
  expect_error(with([](RopeParams& p) { p.rope_type = RopeType::kLongrope; p.original_max_position = 9; p.short_factor = {1, 1, 1, 1}; p.long_factor = {1, 0, 1, 1}; }), "long_factor");
  expect_error(with([](RopeParams& p) { p.short_factor = {1, 1, 1, 1}; }), "short_factor");
  expect_error(with([](RopeParams& p) { p.longrope_factors = LongropeFactors::kLong; }), "longrope_factors");
  expect_error(with([](RopeParams& p) { p.attention_factor = 0; }), "attention_factor");
  expect_error(with([](RopeParams& p) { p.freq_factors = {1, 2}; }), "freq_factors");
  expect_error(with([](RopeParams& p) { p.freq_factors = {1, 2, NAN, 1}; }), "freq_factors");
  expect_error(with([](RopeParams& p) { p.inv_freq = {1, 2, -1, 1}; }), "inv_freq");
  expect_error(with([](RopeParams& p) { p.inv_freq = {1, 2, 1, 1}; p.freq_factors = {1, 1, 1, 1}; }), "inv_freq");
  expect_error(with([](RopeParams& p) { p.inv_freq = {1, 2, 1, 1}; p.rope_type = RopeType::kLinear; p.factor = 2; }), "inv_freq");
  expect_error(with([](RopeParams& p) { p.rope_type = RopeType::kNtk; p.factor = 2; p.rotary_dim = 2; }), "rotary_dim");
  expect_error(with([](RopeParams& p) { p.rope_type = static_cast<RopeType>(9); }), "rope_type");
  expect_error(with([](RopeParams& p) { p.angles = static_cast<RopeAngles>(5); }), "angles");
  expect_error(with([](RopeParams& p) { p.seq_len = -1; }), "seq_len");
  expect_error(with([](RopeParams& p) { p.seq_len = 1; }), "seq_len");  // the call has positions 0, 1
  EXPECT_TRUE(reference::rope_forward(with([](RopeParams& p) { p.seq_len = 2; }), xv, {}, yv).ok());
  EXPECT_EQ(parse_rope_type("su").status().arg(), "rope_type");
  EXPECT_EQ(parse_rope_angles("exact").status().arg(), "angles");
  EXPECT_EQ(parse_longrope_factors("both").status().arg(), "longrope_factors");
  for (RopeType t : {RopeType::kDefault, RopeType::kLinear, RopeType::kNtk, RopeType::kDynamic, RopeType::kYarn,
                     RopeType::kLlama3, RopeType::kLongrope})
    EXPECT_EQ(*parse_rope_type(rope_type_name(t)), t);
}

// ---- config.json -------------------------------------------------------------------------------

RopeModelConfig config(const std::string& json) {
  auto c = rope_config_from_json(json);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : RopeModelConfig{};
}

std::string config_error(const std::string& json) {
  auto c = rope_config_from_json(json);
  EXPECT_FALSE(c.ok()) << json;
  return c.ok() ? std::string() : c.status().arg();
}

// Qwen2-VL's M-RoPE: "mrope" (or "default" with a section, as Qwen2.5-VL saves it) is the default
// scheme plus mrope_section; the section must sum to r/2.
TEST(RopeConfig, MropeSectionOfQwen2Vl) {
  const std::string head = R"({"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28,
      "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rope_scaling": )";
  for (const std::string sc : {R"({"type": "mrope", "mrope_section": [16, 24, 24]})",
                               R"({"rope_type": "mrope", "mrope_section": [16, 24, 24]})",
                               R"({"type": "default", "rope_type": "default", "mrope_section": [16, 24, 24]})"}) {
    const RopeModelConfig c = config(head + sc + "}");
    EXPECT_EQ(c.head_dim, 128) << sc;
    EXPECT_EQ(c.params.rotary_dim, 128) << sc;
    EXPECT_EQ(c.params.theta, 1e6) << sc;
    EXPECT_EQ(c.params.rope_type, RopeType::kDefault) << sc;
    EXPECT_EQ(c.params.layout, RopeLayout::kHalf) << sc;
    EXPECT_EQ(c.mrope_section, (std::vector<std::int64_t>{16, 24, 24})) << sc;
  }
  EXPECT_TRUE(config(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "rope_theta": 1e4})")
                  .mrope_section.empty());
  EXPECT_EQ(config_error(head + R"({"type": "mrope", "mrope_section": [16, 24, 20]}})"), "rope_scaling.mrope_section");
  EXPECT_EQ(config_error(head + R"({"type": "mrope", "mrope_section": [16, 48]}})"), "rope_scaling.mrope_section");
  EXPECT_EQ(config_error(head + R"({"type": "mrope"}})"), "rope_scaling.mrope_section");
}

// Models without RoPE: one error naming the config, "this model has no rotary embedding".
TEST(RopeConfig, ModelsWithoutRotaryEmbeddingsAreAnError) {
  for (const auto& [json, mt] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model_type": "bert", "position_embedding_type": "absolute", "hidden_size": 768,
                "num_attention_heads": 12, "max_position_embeddings": 512})", "bert"},
           {R"({"model_type": "gpt2", "n_positions": 1024, "n_embd": 768, "n_head": 12})", "gpt2"}}) {
    auto c = rope_config_from_json(json);
    ASSERT_FALSE(c.ok()) << mt;
    EXPECT_EQ(c.status().arg(), "config");
    EXPECT_EQ(c.status().what(), "this model has no rotary embedding (model_type " + mt + ")");
  }
  // position_embedding_type "rotary" (ESM) with rope_theta is read
  EXPECT_EQ(config(R"({"model_type": "esm", "position_embedding_type": "rotary", "rope_theta": 10000,
      "hidden_size": 64, "num_attention_heads": 2})").params.rotary_dim, 32);
}

TEST(RopeConfig, ReleasedModelsHandChecked) {
  // Llama 3.1 8B: head 4096/32 = 128, theta 5·10⁵, llama3 {8, 1, 4, 8192}: ω_0 kept, ω_63 divided by 8.
  const RopeModelConfig l = config(R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
      "max_position_embeddings": 131072, "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}})");
  EXPECT_EQ(l.head_dim, 128);
  EXPECT_EQ(l.params.rotary_dim, 128);
  EXPECT_EQ(l.params.layout, RopeLayout::kHalf);
  EXPECT_EQ(l.params.rope_type, RopeType::kLlama3);
  const RopeFrequencies fl = freqs(l.params, l.head_dim);
  EXPECT_DOUBLE_EQ(fl.inv_freq[0], 1.0);
  EXPECT_NEAR(fl.inv_freq[63], std::pow(500000.0, -126.0 / 128) / 8, 1e-20);
  // Qwen2.5-7B-Instruct with its recommended YaRN: factor 4 as given (transformers ≥ 4.56), band from
  // 32768, a = 1 + 0.1 ln 4; the note says that max/original = 1 differs.
  const RopeModelConfig q = config(R"({"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
      "max_position_embeddings": 32768, "rope_theta": 1000000.0,
      "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}})");
  EXPECT_EQ(q.head_dim, 128);
  EXPECT_EQ(q.params.factor, 4.0);
  EXPECT_EQ(q.params.original_max_position, 32768);
  EXPECT_NEAR(freqs(q.params, 128).attention_factor, 1.1386294361119891, 1e-15);
  ASSERT_EQ(q.notes.size(), 1u);
  EXPECT_NE(q.notes[0].find("explicit factor"), std::string::npos);
  // DeepSeek-V3: the rotated head is qk_rope_head_dim = 64, interleaved; mscale = mscale_all_dim → a = 1.
  const RopeModelConfig d = config(R"({"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "max_position_embeddings": 163840,
      "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"}})");
  EXPECT_EQ(d.head_dim, 64);
  EXPECT_EQ(d.params.layout, RopeLayout::kInterleaved);
  EXPECT_DOUBLE_EQ(freqs(d.params, 64).attention_factor, 1.0);
  EXPECT_EQ(d.params.factor, 40.0);
  // Phi-3 128k ("su" → longrope): s = 131072/4096 = 32, a = √(17/12); short within 4096, long beyond.
  std::string sf, lf;
  for (int i = 0; i < 48; ++i) {
    sf += (i ? ", " : "") + std::to_string(1.0 + i / 16.0);
    lf += (i ? ", " : "") + std::to_string(1.0 + i);
  }
  const RopeModelConfig ph = config(R"({"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
      "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
      "rope_scaling": {"type": "su", "short_factor": [)" + sf + R"(], "long_factor": [)" + lf + "]}}");
  EXPECT_EQ(ph.params.rope_type, RopeType::kLongrope);
  EXPECT_EQ(ph.params.factor, 32.0);
  EXPECT_EQ(ph.params.original_max_position, 4096);
  EXPECT_NEAR(freqs(ph.params, 96).attention_factor, std::sqrt(17.0 / 12.0), 1e-15);
  EXPECT_NEAR(freqs(ph.params, 96, 4096).inv_freq[47], std::pow(1e4, -94.0 / 96) / (1 + 47 / 16.0), 1e-18);
  EXPECT_NEAR(freqs(ph.params, 96, 4097).inv_freq[47], std::pow(1e4, -94.0 / 96) / 48, 1e-18);
  // Pythia: rotary_pct 0.25 of 1024/16 = 64 → 16 rotated dimensions, rotary_emb_base theta.
  const RopeModelConfig py = config(R"({"model_type": "gpt_neox", "hidden_size": 1024, "num_attention_heads": 16,
      "max_position_embeddings": 2048, "rotary_emb_base": 10000, "rotary_pct": 0.25})");
  EXPECT_EQ(py.head_dim, 64);
  EXPECT_EQ(py.params.rotary_dim, 16);
  EXPECT_EQ(py.params.theta, 10000.0);
  EXPECT_EQ(py.params.rope_type, RopeType::kDefault);
  // CodeLlama: theta 10⁶, no scaling; dynamic NTK window is max_position_embeddings.
  const RopeModelConfig cl = config(R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
      "max_position_embeddings": 16384, "rope_scaling": null, "rope_theta": 1000000})");
  EXPECT_EQ(cl.params.theta, 1e6);
  EXPECT_EQ(cl.params.rope_type, RopeType::kDefault);
  const RopeModelConfig dy = config(R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
      "max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "factor": 2.0}})");
  EXPECT_EQ(dy.params.original_max_position, 4096);
  EXPECT_EQ(freqs(dy.params, 128, 4096).inv_freq, freqs(RopeParams{}, 128).inv_freq);
  EXPECT_NEAR(freqs(dy.params, 128, 8192).inv_freq[63], std::pow(1e4, -126.0 / 128) / 3, 1e-18);
}

TEST(RopeConfig, BadConfigsNameTheField) {
  const std::string head = R"("model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 64, )";
  auto c = [&](const std::string& rest) { return "{" + head + rest + "}"; };
  EXPECT_EQ(config_error("[1, 2]"), "config");
  EXPECT_EQ(config_error("{not json"), "config");
  EXPECT_EQ(config_error(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})"), "rope_theta");
  EXPECT_EQ(config_error(c(R"("rope_theta": "big")")), "rope_theta");
  EXPECT_EQ(config_error(c(R"("rope_theta": -1)")), "rope_theta");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"type": "su", "factor": 2})")), "rope_scaling.type");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"rope_type": "llama4"})")), "rope_scaling.rope_type");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"rope_type": "mrope"})")), "rope_scaling.mrope_section");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"type": "linear", "rope_type": "yarn", "factor": 2})")), "rope_scaling.type");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"factor": 2})")), "rope_scaling.rope_type");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"type": "linear", "facter": 2})")), "rope_scaling.facter");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"type": "linear"})")), "rope_scaling.factor");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": "2"})")), "rope_scaling.factor");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"type": "yarn", "factor": 2, "beta_fast": 0})")), "rope_scaling.beta_fast");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"type": "yarn", "factor": 2, "truncate": 0})")), "rope_scaling.truncate");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2, "attention_factor": 2})")), "rope_scaling.attention_factor");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4})")),
            "rope_scaling.original_max_position_embeddings");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1, "original_max_position_embeddings": 8})")),
            "rope_scaling.high_freq_factor");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"type": "longrope", "short_factor": [1, 1], "long_factor": [1, 1, 1, 1, 1, 1, 1, 1], "factor": 2})")),
            "rope_scaling.short_factor");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": {"type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, 1], "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]})")),
            "rope_scaling.factor");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_scaling": [1])")), "rope_scaling");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_local_base_freq": 10000)")), "rope_local_base_freq");
  EXPECT_EQ(config_error(c(R"("rope_parameters": {"rope_theta": 1e4})")), "rope_parameters");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "partial_rotary_factor": 0.1)")), "partial_rotary_factor");  // int(16·0.1) = 1
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "partial_rotary_factor": 1.5)")), "partial_rotary_factor");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rotary_pct": 0.5)")), "rotary_pct");  // not GPT-NeoX
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "qk_rope_head_dim": 8)")), "qk_rope_head_dim");
  EXPECT_EQ(config_error(c(R"("rope_theta": 1e4, "rope_interleave": "yes")")), "rope_interleave");
  EXPECT_EQ(config_error(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 5, "rope_theta": 1e4})"), "num_attention_heads");
  EXPECT_EQ(config_error(R"({"model_type": "llama", "hidden_size": 64, "rope_theta": 1e4})"), "num_attention_heads");
  EXPECT_EQ(config_error(R"({"model_type": "llama", "head_dim": 63.5, "rope_theta": 1e4})"), "head_dim");
  EXPECT_EQ(config_error(R"({"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4, "rotary_emb_base": 1e4})"), "rotary_pct");
  EXPECT_EQ(config_error(R"({"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4, "rotary_pct": 0.5})"), "rotary_emb_base");
  EXPECT_EQ(config_error(R"({"model_type": "deepseek_v3", "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e4})"), "qk_rope_head_dim");
  EXPECT_EQ(config_error(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e4,
      "rope_scaling": {"type": "dynamic", "factor": 2}})"), "max_position_embeddings");
}

}  // namespace
}  // namespace posenc
