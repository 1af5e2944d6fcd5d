// posenc tour — the catalogue, then a few worked examples from the articles, every number computed by
// the library as the tour runs (nothing is typed in).
#include <cmath>
#include <cstdio>
#include <random>

#include "cli/cli_common.h"

namespace posenc::cli {

namespace {

void heading(const char* title) { std::printf("\n== %s\n", title); }

void print_row(const double* row, std::int64_t n, const char* fmt) {
  std::printf("  [");
  for (std::int64_t j = 0; j < n; ++j) {
    if (std::isinf(row[j]))
      std::printf(" %9s", row[j] < 0 ? "-inf" : "inf");
    else
      std::printf(fmt, row[j] + 0.0);  // + 0.0: print -0 as 0
  }
  std::printf(" ]\n");
}

std::vector<double> randn(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

// “三角函数式位置编码” (docs/articles.md): getPositionEncoding(seq_len=4, d=4, n=100), "I am a robot".
void sinusoid_example() {
  heading("Sinusoidal table, an article's example: 4 positions, d = 4, base n = 100");
  std::printf("  PE[p, 2i] = sin(p / 100^(2i/4)), PE[p, 2i+1] = cos(p / 100^(2i/4))\n");
  Tensor t(DType::kF64, {4, 4});
  SinusoidalParams p;
  p.base = 100.0;
  check_lib(sinusoidal_table(p, Positions{}, t.view()));
  const auto* d = static_cast<const double*>(t.data());
  for (int r = 0; r < 4; ++r) print_row(d + 4 * r, 4, " %11.8f");
  std::printf("  (the article prints the same matrix for \"I am a robot\")\n");
}

void alibi_example() {
  heading("ALiBi slopes by the paper's rule");
  for (std::int64_t h : {8, 12}) {
    const std::vector<double> s = alibi_slopes(h);
    std::printf("  %2lld heads:", static_cast<long long>(h));
    for (double m : s) std::printf(" 2^%g", std::log2(m));
    std::printf("\n");
  }
  std::printf("  (12 heads: the 8-head slopes, then every other slope of the 16-head rule)\n");
  const std::int64_t L = 5;
  Tensor b(DType::kF64, {8, L, L});
  BiasGeometry g;
  g.heads = 8;
  g.q_len = L;
  g.k_len = L;
  check_lib(alibi_bias(AlibiParams{}, g, View{}, View{}, b.view()));
  std::printf("  head 0 of 8 (m = %g), %lld tokens, bias -m|i-j| with the causal mask (j > i hidden):\n",
              alibi_slopes(8)[0], static_cast<long long>(L));
  const auto* d = static_cast<const double*>(b.data());
  for (std::int64_t i = 0; i < L; ++i) {
    std::vector<double> row(d + i * L, d + (i + 1) * L);
    for (std::int64_t j = i + 1; j < L; ++j) row[static_cast<std::size_t>(j)] = -INFINITY;
    print_row(row.data(), L, " %9.2f");
  }
}

void rope_example() {
  const std::int64_t D = 8;
  const RopeParams p;  // the defaults
  std::printf("\n== RoPE: q_m . k_n depends only on m - n (d = %lld, theta = %g, %s)\n",
              static_cast<long long>(D), p.theta, rope_layout_name(p.layout));
  const std::vector<std::pair<std::int64_t, std::int64_t>> pairs = {
      {5, 2}, {105, 102}, {100005, 100002}, {5, 4}};
  const std::int64_t L = static_cast<std::int64_t>(pairs.size());
  const std::vector<double> qv = randn(D, 1), kv = randn(D, 2);
  // One sequence of L tokens, all holding the same q (resp. k), at the positions of the pairs.
  Tensor q(DType::kF64, {1, L, 1, D}), k(DType::kF64, {1, L, 1, D});
  Tensor qpos(DType::kI64, {L}), kpos(DType::kI64, {L});
  for (std::int64_t l = 0; l < L; ++l) {
    for (std::int64_t c = 0; c < D; ++c) {
      static_cast<double*>(q.data())[l * D + c] = qv[static_cast<std::size_t>(c)];
      static_cast<double*>(k.data())[l * D + c] = kv[static_cast<std::size_t>(c)];
    }
    static_cast<std::int64_t*>(qpos.data())[l] = pairs[static_cast<std::size_t>(l)].first;
    static_cast<std::int64_t*>(kpos.data())[l] = pairs[static_cast<std::size_t>(l)].second;
  }
  Tensor qr(DType::kF64, q.shape()), kr(DType::kF64, k.shape());
  check_lib(rope_forward(p, q.view(), Positions{qpos.view(), 0}, qr.view()));
  check_lib(rope_forward(p, k.view(), Positions{kpos.view(), 0}, kr.view()));
  double plain = 0;
  for (std::int64_t c = 0; c < D; ++c)
    plain += qv[static_cast<std::size_t>(c)] * kv[static_cast<std::size_t>(c)];
  std::printf("  without rotation q . k = %.12f\n", plain);
  for (std::int64_t l = 0; l < L; ++l) {
    double dot = 0;
    for (std::int64_t c = 0; c < D; ++c)
      dot +=
          static_cast<const double*>(qr.data())[l * D + c] * static_cast<const double*>(kr.data())[l * D + c];
    const auto [m, n] = pairs[static_cast<std::size_t>(l)];
    std::printf("  m = %6lld, n = %6lld, m - n = %lld:  q_m . k_n = %.12f\n", static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(m - n), dot);
  }
}

void t5_example() {
  const T5Params p;  // the defaults
  std::printf("\n== T5 buckets (%s, %lld buckets, max_distance %lld), relative position = key - query\n",
              p.bidirectional ? "bidirectional" : "unidirectional", static_cast<long long>(p.num_buckets),
              static_cast<long long>(p.max_distance));
  check_lib(t5_validate(p));
  std::printf("  distance:");
  const std::vector<std::int64_t> rs = {-200, -128, -64, -16, -8, -7, -1, 0, 1, 7, 8, 16, 64, 128, 200};
  for (std::int64_t r : rs) std::printf(" %4lld", static_cast<long long>(r));
  std::printf("\n  bucket:  ");
  for (std::int64_t r : rs) std::printf(" %4lld", static_cast<long long>(t5_bucket(r, p)));
  const std::int64_t exact = (p.bidirectional ? p.num_buckets / 2 : p.num_buckets) / 2;
  std::printf(
      "\n  (one bucket per distance for |r| < %lld, then log-spaced; at %lld and beyond, all share the last "
      "bucket)\n",
      static_cast<long long>(exact), static_cast<long long>(p.max_distance));
}

// “语言模型为什么需要位置编码” (docs/articles.md): "我妈想你了" and "我想你妈了" hold the same tokens; without positions attention cannot tell.
void order_example() {
  heading("Same tokens, two orders (an article's example): 我妈想你了 / 我想你妈了");
  const std::vector<std::string> tokens = {"我", "妈", "想", "你", "了"};
  const std::vector<std::size_t> a = {0, 1, 2, 3, 4}, b = {0, 2, 3, 1, 4};  // token ids in order
  const std::int64_t L = 5, D = 8;
  const std::vector<double> emb = randn(tokens.size() * D, 7);  // one vector per token
  auto sentence = [&](const std::vector<std::size_t>& ids) {
    Tensor x(DType::kF64, {1, L, 1, D});
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int64_t c = 0; c < D; ++c)
        static_cast<double*>(x.data())[l * D + c] =
            emb[ids[static_cast<std::size_t>(l)] * D + static_cast<std::size_t>(c)];
    return x;
  };
  const Tensor xa = sentence(a), xb = sentence(b);
  for (Encoding enc : {Encoding::kNope, Encoding::kRope}) {
    AttentionParams p;
    p.encoding = enc;
    Tensor oa(DType::kF64, xa.shape()), ob(DType::kF64, xb.shape());
    check_lib(attention_forward(p, xa.view(), xa.view(), xa.view(), EncodingTensors{}, oa.view()));
    check_lib(attention_forward(p, xb.view(), xb.view(), xb.view(), EncodingTensors{}, ob.view()));
    // Compare each token's output across the two sentences.
    double worst = 0;
    for (std::int64_t lb = 0; lb < L; ++lb) {
      std::int64_t la = 0;
      while (a[static_cast<std::size_t>(la)] != b[static_cast<std::size_t>(lb)]) ++la;
      for (std::int64_t c = 0; c < D; ++c)
        worst = std::max(worst, std::fabs(static_cast<const double*>(oa.data())[la * D + c] -
                                          static_cast<const double*>(ob.data())[lb * D + c]));
    }
    std::printf("  %-4s: max |out(token, sentence 1) - out(token, sentence 2)| = %.3g  -> %s\n",
                encoding_info(enc).name.c_str(), worst,
                worst < 1e-12 ? "the same outputs, permuted: word order is invisible"
                              : "the outputs differ: the order is seen");
  }
}

void run_tour() {
  std::printf("posenc tour: positional encodings, computed by the library as you read.\n\n");
  print_catalogue();
  sinusoid_example();
  alibi_example();
  rope_example();
  t5_example();
  order_example();
  std::printf("\nMore: posenc list --json, posenc <command> --help.\n");
}

}  // namespace

Command add_tour_command(CLI::App& root) {
  CLI::App* app = root.add_subcommand("tour", "a short guided tour: the catalogue and worked examples");
  app->allow_extras();
  return {app, [] { run_tour(); }};
}

}  // namespace posenc::cli
