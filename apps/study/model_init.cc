// The study model's initial weights (model_init.h).
#include "study/model_init.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "posenc/rotary.h"

namespace posenc {
namespace {

// A deterministic N(0, 1) stream: mt19937_64 bits → uniforms in (0, 1) → Box–Muller.
class Normal {
 public:
  explicit Normal(std::uint64_t seed) : rng_(seed) {}
  double next() {
    if (have_) {
      have_ = false;
      return spare_;
    }
    const double u1 = uniform(), u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * M_PI * u2;
    spare_ = r * std::sin(a);
    have_ = true;
    return r * std::cos(a);
  }

 private:
  double uniform() { return (double(rng_() >> 11) + 0.5) * 0x1.0p-53; }
  std::mt19937_64 rng_;
  double spare_ = 0;
  bool have_ = false;
};

}  // namespace

std::vector<double> initial_weights(const ModelConfig& c, const std::vector<ParamInfo>& layout, std::size_t n,
                                    std::uint64_t seed) {
  std::vector<double> w(n, 0.0);
  Normal rnd(seed);
  // GPT-2's initialisation: N(0, 0.02), the residual projections shrunk by 1/√(2·layers), LayerNorm
  // gains 1, biases 0; encoding tensors N(0, 0.02) except xl's u, v (0), t5's table (N(0, 0.1)),
  // FIRE's first layer N(0, 1) with c = 0.1, L = the training length and b2 = 0, and KERPLE's r1, r2
  // (below).
  // The token table is N(0, 1/C) so that √C·E[token] has unit scale like the sinusoid added to it
  // (Vaswani et al. §3.4), and a learned position table starts at that scale too.
  const double resid = 0.02 / std::sqrt(2.0 * double(c.n_layers));
  for (const ParamInfo& p : layout) {
    const std::string& nm = p.name;
    const auto ends = [&](const char* s) {
      const std::size_t k = std::strlen(s);
      return nm.size() >= k && nm.compare(nm.size() - k, k, s) == 0;
    };
    double sd = 0.02, fill = 0;
    bool random = true;
    if (ends(".g")) random = false, fill = 1;
    else if (ends(".b") || ends(".bqkv") || ends(".bo") || ends(".b1") || ends(".b2") || ends("xl_u") ||
             ends("xl_v") || ends("alibi_w"))
      random = false;
    else if (ends("attn.wo") || ends("mlp.w2")) sd = resid;
    else if (ends("t5_bias")) sd = 0.1;
    else if (nm == "tok_emb") sd = 1.0 / std::sqrt(double(c.d_model));
    else if (nm == "pos_emb") sd = 1.0;
    else if (ends("fire_w1") || ends("fire_b1")) sd = 1.0;  // breakpoints −b1/w1 spread over x
    else if (ends("fire_b2")) random = false;
    else if (ends("fire_c")) random = false, fill = 0.1;              // the paper's c
    else if (ends("fire_L")) random = false, fill = double(c.max_len);  // the training length
    if (ends("rope2d_freqs")) {
      // RoPE-Mixed's initialisation (rotary.h) with the heads' directions α_h = 2π(h + ½)/H spread
      // evenly (the authors draw them uniformly in [0, 2π)); magnitudes from theta = 10.
      std::vector<double> angles(static_cast<std::size_t>(c.n_heads));
      for (std::size_t h = 0; h < angles.size(); ++h)
        angles[h] = 2 * M_PI * (double(h) + 0.5) / double(angles.size());
      const Expected<std::vector<double>> f = rope2d_mixed_init(c.n_heads, c.head_dim(), 10.0, angles);
      for (std::size_t i = 0; i < p.size && f.ok(); ++i) w[p.offset + i] = f.value()[i];
      continue;
    }
    if (ends("kerple_r1") || ends("kerple_r2")) {
      // Spread over the heads like ALiBi's slopes: r1 = (h+1)/H, r2 = 2(h+1)/H (≤ 2 for the power
      // kernel); the authors draw them uniformly in (0, 1) and (0, 2).
      const double top = ends("kerple_r1") ? 1.0 : 2.0;
      for (std::size_t i = 0; i < p.size; ++i) w[p.offset + i] = top * double(i + 1) / double(p.size);
      continue;
    }
    for (std::size_t i = 0; i < p.size; ++i) w[p.offset + i] = random ? sd * rnd.next() : fill;
  }
  return w;
}

}  // namespace posenc
