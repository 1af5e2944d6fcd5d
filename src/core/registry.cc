#include "posenc/registry.h"

namespace posenc {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kNone: return "none";
    case Kind::kAbsolute: return "absolute";
    case Kind::kRotary: return "rotary";
    case Kind::kLogitBias: return "logit_bias";
    case Kind::kContextual: return "contextual";
  }
  return "?";
}

namespace {

// RoPE's parameters (rope.h), shared by the rotary encodings that read RoPE's frequencies (rope,
// mrope, xpos): one declaration, each encoding's own defaults for layout and theta, and the
// config.json only for rope itself.
std::vector<ParamSpec> rope_specs(const std::string& layout_default, bool with_config) {
  std::vector<ParamSpec> v = {
      {"layout", "choice", layout_default, {"half", "interleaved"},
       "pairs (k,k+r/2) as Hugging Face/vLLM/GPT-NeoX, or (2k,2k+1) as RoFormer/Meta Llama/GPT-J", false},
      {"rotary-dim", "int", "0", {}, "dimensions that rotate (even, <= d; 0 = all)", false},
      {"theta", "float", "10000", {}, "frequency base", false},
      {"rope-type", "choice", "default", {"default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope"},
       "frequency scheme (Hugging Face rope_type; ntk: static NTK-aware base)", false},
      {"factor", "float", "1", {}, "scale s of linear, ntk, dynamic, yarn, llama3, longrope", false},
      {"original-max-position", "int", "0", {},
       "trained context L: dynamic's window, yarn's band, llama3, longrope's short/long switch", false},
      {"beta-fast", "float", "32", {}, "yarn: rotations where extrapolation ends", false},
      {"beta-slow", "float", "1", {}, "yarn: rotations where interpolation starts", false},
      {"truncate", "bool", "true", {}, "yarn: floor/ceil the correction range", false},
      {"mscale", "float", "0", {}, "yarn: attention factor m(s, mscale)/m(s, mscale-all-dim) (0 = absent)", false},
      {"mscale-all-dim", "float", "0", {}, "yarn: see --mscale (0 = absent)", false},
      {"low-freq-factor", "float", "1", {}, "llama3: wavelengths above L/low are divided by s", false},
      {"high-freq-factor", "float", "4", {}, "llama3: wavelengths below L/high are kept", false},
      {"short-factor", "tensor", "", {}, "longrope: per-pair divisors [r/2] within L", false},
      {"long-factor", "tensor", "", {}, "longrope: per-pair divisors [r/2] beyond L", false},
      {"longrope-factors", "choice", "by-length", {"by-length", "short", "long"},
       "longrope: the list by the call's length, or forced", false},
      {"attention-factor", "float", "", {}, "multiplies cos and sin (default: the scheme's, 1 for most)", false},
      {"freq-factors", "tensor", "", {}, "per-pair divisors [r/2] applied after the scheme", false},
      {"inv-freq", "tensor", "", {}, "the frequencies [r/2] outright (rope-type default)", false},
      {"angles", "choice", "accurate", {"accurate", "hf"},
       "angles in double, or transformers' float32 inv_freq * position (bit parity)", false},
      {"seq-len", "int", "0", {}, "the call's length for dynamic and longrope (0: largest position + 1)", false}};
  if (with_config)
    v.push_back({"config", "file", "", {},
                 "a Hugging Face config.json: sets the RoPE parameters (not --layout, --angles, --seq-len, "
                 "--longrope-factors, which may be given with it)",
                 false});
  return v;
}

// mrope's: RoPE's, and a config.json of an M-RoPE model (Qwen2-VL), which also sets the section.
std::vector<ParamSpec> mrope_rope_specs() {
  std::vector<ParamSpec> v = rope_specs("half", true);
  v.back().help = "a Hugging Face config.json of an M-RoPE model (Qwen2-VL, Qwen2.5-VL): sets --mrope-section and "
                  "the RoPE parameters (not --variant, --layout, --angles, --seq-len, --longrope-factors, which may "
                  "be given with it)";
  return v;
}

std::vector<ParamSpec> join(std::vector<ParamSpec> a, const std::vector<ParamSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<EncodingInfo> build() {
  return {
      {Encoding::kNope, "nope", Kind::kNone, "no position information: the baseline",
       "Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization "
       "(arXiv 2305.19466)",
       {}},
      {Encoding::kLearned, "learned", Kind::kAbsolute,
       "learned absolute table E[max_len, d] added to the embeddings: y = x + E[pos]",
       "Devlin et al. 2019, BERT (arXiv 1810.04805); Gehring et al. 2017 (arXiv 1705.03122)",
       {{"table", "tensor", "", {}, "E [max_len, d]; a position >= max_len is an error", true}}},
      {Encoding::kSinusoidal, "sinusoidal", Kind::kAbsolute,
       "fixed sinusoids added to the embeddings: PE[p,2i]=sin(p/base^(2i/d)), PE[p,2i+1]=cos(...)",
       "Vaswani et al. 2017, Attention Is All You Need (arXiv 1706.03762), section 3.5",
       {{"base", "float", "10000", {}, "wavelength base", false}}},
      {Encoding::kRope, "rope", Kind::kRotary,
       "rotary: pairs of q/k dimensions rotated by position x omega_k (theta^(-2k/r) or a released "
       "model's scaling: linear, ntk, dynamic, yarn, llama3, longrope)",
       "Su et al. 2021, RoFormer (arXiv 2104.09864); Chen et al. 2023 (arXiv 2306.15595); Peng et al. "
       "2023, YaRN (arXiv 2309.00071); Ding et al. 2024, LongRoPE (arXiv 2402.13753); Llama 3.1",
       rope_specs("half", true)},
      {Encoding::kAlibi, "alibi", Kind::kLogitBias,
       "linear biases: -m_h*|i-j| added to the logits, slopes by the paper's geometric rule",
       "Press et al. 2022, Train Short, Test Long (arXiv 2108.12409)",
       {{"variant", "choice", "symmetric", {"symmetric", "nonsymmetric", "learned"},
         "symmetric -m|i-j|; nonsymmetric: half the heads look back, half forward; learned slopes",
         false},
        {"slopes", "tensor", "", {}, "optional caller-given slopes [H] (default: the paper's rule)",
         false},
        {"weights", "tensor", "", {}, "learned variant: raw parameters [2, H], slope -sigmoid(w)",
         true}}},
      {Encoding::kT5, "t5", Kind::kLogitBias,
       "learned scalar per head and log-spaced relative-distance bucket",
       "Raffel et al. 2020, T5 (arXiv 1910.10683); Shaw et al. 2018 (arXiv 1803.02155)",
       {{"weights", "tensor", "", {}, "bias table [num_buckets, H]", true},
        {"bidirectional", "bool", "true", {}, "separate buckets for keys after the query", false},
        {"num-buckets", "int", "32", {}, "number of buckets", false},
        {"max-distance", "int", "128", {}, "distance beyond which all share the last bucket",
         false}}},
      {Encoding::kXL, "xl", Kind::kLogitBias,
       "Transformer-XL relative attention: (q+u).k + (q+v).W s(i-j), s a sinusoid of the distance",
       "Dai et al. 2019, Transformer-XL (arXiv 1901.02860), section 3.3",
       {{"u", "tensor", "", {}, "content bias u [H, d]", true},
        {"v-bias", "tensor", "", {}, "position bias v [H, d]", true},
        {"rel-proj", "tensor", "", {}, "projection W [H, d, R] of the R-dim sinusoid", true}}},
      {Encoding::kCope, "cope", Kind::kContextual,
       "contextual positions: counts of sigmoid gates, interpolated into a learned table",
       "Golovneva et al. 2024, Contextual Position Encoding (arXiv 2405.18719)",
       {{"table", "tensor", "", {}, "position embeddings e [npos, d]", true}}},
      // ---- the extrapolating biases beyond ALiBi (bias.h) ----
      {Encoding::kKerple, "kerple", Kind::kLogitBias,
       "kernelized distance: -r1*log(1+r2*|i-j|) (log) or -r1*|i-j|^r2 (power), r1, r2 per head",
       "Chi et al. 2022, KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation "
       "(arXiv 2205.09921), its power and logarithmic variants",
       {{"kernel", "choice", "log", {"log", "power"},
         "log: -r1*log(1+r2*|i-j|); power: -r1*|i-j|^r2 (0 < r2 <= 2)", false},
        {"r1", "tensor", "", {}, "per-head scale r1 [H], every value > 0", true},
        {"r2", "tensor", "", {}, "per-head shape r2 [H], every value > 0 (power: <= 2)", true}}},
      {Encoding::kSandwich, "sandwich", Kind::kLogitBias,
       "parameter-free: (sum_k cos((i-j)/base^(2k/d)) - d/2) * H/(8(h+1)), the sinusoids' inner "
       "product",
       "Chi et al. 2023, Dissecting Transformer Length Extrapolation via the Lens of Receptive Field "
       "Analysis (arXiv 2212.10356), Sandwich",
       {{"sinusoid-dim", "int", "128", {}, "dimension d of the sinusoids (even; d/2 frequencies)", false},
        {"base", "float", "10000", {}, "wavelength base", false}}},
      {Encoding::kFire, "fire", Kind::kLogitBias,
       "learned function of the normalised distance: MLP(psi(|i-j|)/psi(max(L,i))), psi(x) = "
       "log(c*x+1)",
       "Li et al. 2023, Functional Interpolation for Relative Positions Improves Long Context "
       "Transformers (arXiv 2310.04418), FIRE with progressive interpolation",
       {{"mlp-w1", "tensor", "", {}, "first layer weights w1 [W] (scalar input, W hidden units)", true},
        {"mlp-b1", "tensor", "", {}, "first layer bias b1 [W]", true},
        {"mlp-w2", "tensor", "", {}, "second layer weights w2 [H, W] (one output per head)", true},
        {"mlp-b2", "tensor", "", {}, "second layer bias b2 [H]", true},
        {"c", "tensor", "", {}, "log-transform scale c [1], > 0", true},
        {"threshold", "tensor", "", {}, "normaliser threshold L [1], > 0", true}}},
      // ---- the rotary encodings beyond 1D RoPE (rotary.h) ----
      {Encoding::kRope2d, "rope2d", Kind::kRotary,
       "2D rotary for images, positions (x, y): axial (first r/4 pairs by x, next r/4 by y, "
       "theta^(-4j/r)) or mixed (x*theta_x + y*theta_y, learned per head)",
       "Heo et al. 2024, Rotary Position Embedding for Vision Transformer (RoPE-ViT, arXiv 2403.13298)",
       {{"variant", "choice", "axial", {"axial", "mixed"},
         "axial: fixed frequencies per axis; mixed: learned frequencies --freqs [2, H, r/2]", false},
        {"layout", "choice", "half", {"half", "interleaved"},
         "pairs (k,k+r/2), or (2k,2k+1) as the authors' complex form", false},
        {"rotary-dim", "int", "0", {}, "dimensions that rotate (a multiple of 4, <= d; 0 = all)", false},
        {"theta", "float", "", {},
         "frequency base (default 100 for axial, 10 for mixed's initialisation, as the authors' code)", false},
        {"freqs", "tensor", "", {}, "mixed: learned frequencies [2, H, r/2] (theta_x, theta_y per head and pair)",
         true}}},
      {Encoding::kMrope, "mrope", Kind::kRotary,
       "multimodal rotary, positions (t, h, w): pairs split into sections s_t, s_h, s_w, chunked "
       "(Qwen2-VL) or interleaved (Qwen3-VL); text (t = h = w) is RoPE",
       "Wang et al. 2024, Qwen2-VL (arXiv 2409.12191), M-RoPE; transformers' Qwen2-VL and Qwen3-VL",
       join({{"variant", "choice", "chunked", {"chunked", "interleaved"},
              "chunked: pairs [0, s_t) by t, then h, then w; interleaved: t h w t h w ... by pair index", false},
             {"mrope-section", "ints", "", {},
              "pairs per position row s_t,s_h,s_w summing to r/2 (required; Qwen2-VL: 16,24,24 for r = 128)",
              false}},
            mrope_rope_specs())},
      {Encoding::kXpos, "xpos", Kind::kRotary,
       "rotary with a per-pair decay: q scaled by zeta_k^((m-c)/scale_base), k by zeta_k^(-(n-c)/scale_base), "
       "zeta_k = (2k/r + gamma)/(1 + gamma)",
       "Sun et al. 2022, A Length-Extrapolatable Transformer (xPos, arXiv 2212.10554); torchscale's XPOS",
       join({{"scale-base", "float", "512", {}, "the exponent's divisor (the paper's 512)", false},
             {"gamma", "float", "0.4", {}, "zeta_k = (2k/r + gamma)/(1 + gamma)", false},
             {"center", "int", "", {},
              "position c where both scales are 1 (default ceil(n/2), n the call's length, as torchscale)", false}},
            rope_specs("half", false))},
  };
}

}  // namespace

const std::vector<EncodingInfo>& registry() {
  static const std::vector<EncodingInfo> r = build();
  return r;
}

Expected<EncodingInfo> find_encoding(const std::string& name) {
  std::string known;
  for (const EncodingInfo& e : registry()) {
    if (e.name == name) return e;
    known += (known.empty() ? "" : ", ") + e.name;
  }
  return Status::Invalid("ENC", "unknown encoding '" + name + "', expected one of: " + known);
}

const EncodingInfo& encoding_info(Encoding id) {
  for (const EncodingInfo& e : registry())
    if (e.id == id) return e;
  return registry().front();
}

}  // namespace posenc
