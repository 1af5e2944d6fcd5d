// Rotates q and k by the RoPE of a Hugging Face config.json, then runs causal ALiBi attention.
#include <posenc/posenc.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>
using namespace posenc;

int main(int argc, char** argv) {
  std::stringstream text;
  text << std::ifstream(argc > 1 ? argv[1] : "config.json").rdbuf();
  Expected<RopeModelConfig> cfg = rope_config_from_json(text.str());  // Llama 3.1: llama3 scheme
  if (!cfg) return std::fprintf(stderr, "%s\n", cfg.status().message().c_str()), 1;
  const std::int64_t B = 1, L = 8, H = 4, D = cfg->head_dim;  // q, k, v, out: [B, L, H, D]
  std::vector<float> q(B * L * H * D), k(q.size()), v(q.size()), out(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = k[i] = v[i] = float(i % 7) / 7 - 0.5f;
  auto view = [&](auto& x) { return View::contiguous(x.data(), DType::kF32, {B, L, H, D}); };
  Status st = rope_apply_qk(cfg->params, view(q), view(k), Positions{}, view(q), view(k));  // in place
  AttentionParams attn{.encoding = Encoding::kAlibi, .causal = true};
  if (st) st = attention_forward(attn, view(q), view(k), view(v), EncodingTensors{}, view(out));
  if (!st) return std::fprintf(stderr, "%s\n", st.message().c_str()), 1;
  const float* last = &out[(L - 1) * H * D];  // the last query, head 0
  std::printf("head_dim %lld, out[0, 7, 0, :3] = %.6f %.6f %.6f\n", (long long)D, last[0], last[1], last[2]);
}
