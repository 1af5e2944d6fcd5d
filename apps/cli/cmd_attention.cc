// posenc attention ENC --q Q.npy --k K.npy --v V.npy --out O.npy [--causal] [--scale s]
//                  [--q-offset a] [--k-offset b] [--keys-rotated] [params] [--lse LSE.npy]
//                  [--grad-out dO.npy --grad-q dQ.npy --grad-k dK.npy --grad-v dV.npy
//                   [--grad-weights dW.npy] [--grad-table dE.npy]
//                   [--grad-u dU.npy --grad-v-bias dVb.npy --grad-rel-proj dW.npy]
//                   [--grad-r1 dR1.npy --grad-r2 dR2.npy] [--grad-mlp-w1 … --grad-c … --grad-threshold …]
//                   [--grad-freqs dF.npy]]
//                  [--q-positions QP.npy --k-positions KP.npy]
// softmax(scale·q·kᵀ + encoding terms + mask)·v with q [B, M, Hq, D], k, v [B, N, Hkv, D] (see
// posenc/attention.h); O keeps q's dtype, LSE is float64 [B, Hq, M]. rope takes any scheme of
// posenc/rope.h, or a Hugging Face config.json's RoPE (--config). rope2d and mrope read the queries'
// and keys' multi-dimensional positions from --q-positions / --k-positions ([A, M] / [B, A, M],
// [A, N] / [B, A, N]; absent: the 1D positions in every component); xpos scales q and k itself.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "cli/cli_common.h"

namespace posenc::cli {

namespace {

// Everything but the absolute encodings, which act on embeddings before the first layer.
bool in_attention(Encoding e) { return encoding_info(e).kind != Kind::kAbsolute; }

struct AttentionState {
  std::string enc, q, k, v, out, lse, scale, q_offset, k_offset = "0", grad_out, grad_q, grad_k, grad_v;
  std::string q_positions, k_positions;
  bool causal = false, keys_rotated = false, float32_products = false;
  CLI::Option *scale_opt = nullptr, *q_offset_opt = nullptr, *lse_opt = nullptr, *grad_out_opt = nullptr,
              *grad_q_opt = nullptr, *grad_k_opt = nullptr, *grad_v_opt = nullptr, *q_positions_opt = nullptr,
              *k_positions_opt = nullptr;
  ParamFlags params;
};

// The call's parameters from the flags (RoPE's, mrope's and xpos's later: their lists are .npy
// files), and the flags checked against one another and the encoding before any file is read.
AttentionParams params_from_flags(AttentionState& st, const EncodingInfo& e, bool want_grads) {
  AttentionParams p;
  p.encoding = e.id;
  p.causal = st.causal;
  p.keys_rotated = st.keys_rotated;
  p.bf16_rate = !st.float32_products;
  if (st.scale_opt->count() > 0) p.scale = parse_float("--scale", st.scale);
  if (st.q_offset_opt->count() > 0) p.q_offset = parse_int("--q-offset", st.q_offset);
  p.k_offset = parse_int("--k-offset", st.k_offset);

  // ---- the gradient flags come as a set
  std::vector<std::string> grad_outputs;
  for (auto [flag, opt] : {std::pair{"--grad-q", st.grad_q_opt}, std::pair{"--grad-k", st.grad_k_opt},
                           std::pair{"--grad-v", st.grad_v_opt}})
    if (opt->count() > 0) grad_outputs.push_back(flag);
  for (const std::string& f : st.params.grad_flags_given()) grad_outputs.push_back(f);
  if (!want_grads && !grad_outputs.empty())
    fail(Status::Invalid(grad_outputs.front(), "needs --grad-out (the upstream gradient dO, q's shape)"));
  if (want_grads && grad_outputs.empty())
    fail(Status::Invalid("--grad-out",
                         "given without a gradient to compute: add --grad-q, --grad-k, --grad-v"));

  // ---- the encoding's parameters and the tensors it needs
  const bool takes_positions = e.id == Encoding::kRope2d || e.id == Encoding::kMrope;
  for (auto [flag, opt] : {std::pair{"--q-positions", st.q_positions_opt}, std::pair{"--k-positions", st.k_positions_opt}})
    if (opt->count() > 0 && !takes_positions)
      fail(Status::Invalid(flag, "only rope2d and mrope read multi-dimensional positions (got " + e.name +
                                     ", whose positions are --q-offset + i, --k-offset + j)"));
  switch (e.id) {
    case Encoding::kRope: case Encoding::kMrope: case Encoding::kXpos:
      break;  // after the tensors are read (RoPE's lists are .npy files), below
    case Encoding::kRope2d:
      p.rope2d = rope2d_params(st.params);
      if (p.rope2d.variant == Rope2dVariant::kMixed && !st.params.given("freqs"))
        fail(Status::Invalid("--freqs", "is required for rope2d mixed: the learned frequencies [2, Hq, r/2]"));
      if (p.rope2d.variant != Rope2dVariant::kMixed && !st.params.grad_flags_given().empty())
        fail(Status::Invalid("--grad-freqs", "only rope2d mixed has learned frequencies (got --variant axial)"));
      break;
    case Encoding::kAlibi:
      p.alibi = alibi_params(st.params);
      if (p.alibi.variant != AlibiVariant::kLearned && !st.params.grad_flags_given().empty())
        fail(Status::Invalid("--grad-weights", "only the learned variant has weights (got --variant " +
                                                   std::string(alibi_variant_name(p.alibi.variant)) + ")"));
      if (p.alibi.variant == AlibiVariant::kLearned && !st.params.given("weights"))
        fail(Status::Invalid("--weights", "is required for the learned variant: raw slopes [2, Hq]"));
      break;
    case Encoding::kT5:
      p.t5 = t5_params(st.params);
      if (!st.params.given("weights"))
        fail(Status::Invalid("--weights", "is required for t5: the bias table [--num-buckets, Hq]"));
      break;
    default:
      if (e.id == Encoding::kKerple) p.kerple = kerple_params(st.params);
      if (e.id == Encoding::kSandwich) p.sandwich = sandwich_params(st.params);
      // xl, cope, kerple, fire: every tensor parameter is required (sandwich has none)
      for (const ParamSpec& ps : e.params)
        if (ps.type == "tensor" && !st.params.given(ps.name))
          fail(Status::Invalid("--" + ps.name, "is required for " + e.name + ": " + ps.help));
      break;
  }
  return p;
}

// Scores beyond what the math's float holds turn the softmax into NaN: scale·q·k is bounded by
// |scale|·max|q_i|·max|k_j| (Cauchy–Schwarz), and half the largest float leaves room for the
// running max to be subtracted.
void check_score_range(const AttentionParams& p, const Tensor& q, const Tensor& k) {
  if (q.shape()[3] < 1 || k.shape()[3] < 1) return;  // no scores: the library's shape check names it
  const auto max_norm = [](const Tensor& x) {
    const View v = x.view();
    const std::int64_t D = x.shape()[3], rows = v.numel() / D;
    double m = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (std::int64_t i = 0; i < D; ++i) s += v.get(r * D + i) * v.get(r * D + i);
      m = std::max(m, std::sqrt(s));
    }
    return m;
  };
  const double scale = p.scale ? std::fabs(*p.scale) : 1 / std::sqrt(double(q.shape()[3]));
  const double limit = (q.dtype() == DType::kF64 ? std::numeric_limits<double>::max()
                                                 : double(std::numeric_limits<float>::max())) / 2;
  const double nq = max_norm(q), nk = max_norm(k), bound = scale * nq * nk;
  if (std::isfinite(nq) && std::isfinite(nk) && !(bound <= limit)) {  // a non-finite entry: the library's error
    char msg[256];
    std::snprintf(msg, sizeof msg, "scale × |q| × |k| reaches %.3g, more than the %.3g %s scores can hold; "
                  "expected a smaller %s", bound, limit, q.dtype() == DType::kF64 ? "float64" : "float32",
                  p.scale ? "--scale" : "--q or --k");
    fail(Status::OutOfRange(p.scale ? "--scale" : "--q", msg));
  }
}

void run_attention(AttentionState& st) {
  const EncodingInfo& e = st.params.bind(st.enc, "posenc attention");

  const bool want_grads = st.grad_out_opt->count() > 0;
  AttentionParams p = params_from_flags(st, e, want_grads);

  OutputSet outs;
  check(outs.reserve("--out", st.out));
  if (st.lse_opt->count() > 0) check(outs.reserve("--lse", st.lse));
  for (auto [flag, opt, path] :
       {std::tuple{"--grad-q", st.grad_q_opt, &st.grad_q}, std::tuple{"--grad-k", st.grad_k_opt, &st.grad_k},
        std::tuple{"--grad-v", st.grad_v_opt, &st.grad_v}})
    if (opt->count() > 0) check(outs.reserve(flag, *path));
  st.params.reserve_grads(&outs);

  // ---- inputs
  const Tensor q = read_input("--q", st.q);
  const Tensor k = read_input("--k", st.k);
  const Tensor v = read_input("--v", st.v);
  check(require_float("--q", q.view(), 4));
  check(require_float("--k", k.view(), 4));
  check(require_float("--v", v.view(), 4));
  require_feature_dim("--q", q);
  require_feature_dim("--k", k);
  require_feature_dim("--v", v);
  st.params.load_tensors();
  Tensor dout;
  if (want_grads) {
    dout = read_input("--grad-out", st.grad_out);
    require_float_tensor("--grad-out", dout);
    if (dout.dtype() != q.dtype())  // as apply's dY keeps X's dtype
      fail(Status::Invalid("--grad-out", std::string("expected ") + dtype_name(q.dtype()) + " like --q, got " +
                                             dtype_name(dout.dtype())));
  }
  EncodingTensors t = encoding_tensors(st.params);
  Tensor qpos, kpos;
  // rope2d and mrope take their rotations from the position ids; an offset then only places the
  // causal mask, and without --causal it would be ignored
  if (!p.causal && st.q_offset_opt->count() > 0 && st.q_positions_opt->count() > 0)
    fail(Status::Invalid("--q-offset", "not read with --q-positions unless --causal (it only places the mask)"));
  if (st.q_positions_opt->count() > 0) {
    qpos = read_positions("--q-positions", st.q_positions);
    t.q_positions = qpos.view();
  }
  if (st.k_positions_opt->count() > 0) {
    kpos = read_positions("--k-positions", st.k_positions);
    t.k_positions = kpos.view();
  }
  if (e.id == Encoding::kXpos) p.xpos = xpos_params(st.params);
  if (e.id == Encoding::kRope || e.id == Encoding::kMrope) {
    std::int64_t config_D = 0;
    if (e.id == Encoding::kRope) p.rope = rope_params(st.params, &config_D);
    else p.mrope = mrope_params(st.params, &config_D);
    if (config_D != 0 && q.shape()[3] != config_D)
      fail(Status::Invalid("--q", "expected head dimension D = " + std::to_string(config_D) +
                                      " (from --config), got shape " + q.shape_str()));
  }

  check_score_range(p, q, k);

  // ---- compute everything, then write
  FlagMap names = {{"v_bias", "--v-bias"}, {"rel_proj", "--rel-proj"}, {"q_positions", "--q-positions"},
                   {"k_positions", "--k-positions"}, {"keys_rotated", "--keys-rotated"}};
  // RoPE's parameters from --config name it; an unset --rotary-dim is q's head dimension D.
  for (auto& n : rope_names(st.params, "--q")) names.push_back(n);
  Tensor out(q.dtype(), q.shape());
  Tensor lse;
  if (st.lse_opt->count() > 0) lse = Tensor(DType::kF64, {q.shape()[0], q.shape()[2], q.shape()[1]});
  check_lib(attention_forward(p, q.view(), k.view(), v.view(), t, out.view(),
                              st.lse_opt->count() > 0 ? lse.view() : View{}),
            names);
  Tensor dq, dk, dv;
  if (want_grads) {
    if (st.grad_q_opt->count() > 0) dq = Tensor(q.dtype(), q.shape());
    if (st.grad_k_opt->count() > 0) dk = Tensor(k.dtype(), k.shape());
    if (st.grad_v_opt->count() > 0) dv = Tensor(v.dtype(), v.shape());
    st.params.alloc_grads();
    check_lib(attention_backward(p, q.view(), k.view(), v.view(), t, dout.view(),
                                 st.grad_q_opt->count() > 0 ? dq.view() : View{},
                                 st.grad_k_opt->count() > 0 ? dk.view() : View{},
                                 st.grad_v_opt->count() > 0 ? dv.view() : View{}, encoding_grads(st.params)),
              names);
  }

  outs.attach("--out", &out);
  outs.attach("--lse", &lse);
  outs.attach("--grad-q", &dq);
  outs.attach("--grad-k", &dk);
  outs.attach("--grad-v", &dv);
  st.params.attach_grads(&outs);
  check(outs.commit());
}

}  // namespace

Command add_attention_command(CLI::App& root) {
  auto st = std::make_shared<AttentionState>();
  CLI::App* app = root.add_subcommand(
      "attention",
      "attention with an encoding inside: q [B, M, Hq, D], k, v [B, N, Hkv, D] -> out [B, M, Hq, D]");
  app->allow_extras();
  app->add_option("ENC", st->enc, "the encoding: " + encoding_names(in_attention))->required();
  add_path(app, "--q", &st->q, "queries [B, M, Hq, D]")->required();
  add_path(app, "--k", &st->k, "keys [B, N, Hkv, D] (Hq a multiple of Hkv)")->required();
  add_path(app, "--v", &st->v, "values [B, N, Hkv, D]")->required();
  add_path(app, "--out", &st->out, "output [B, M, Hq, D], q's dtype")->required();
  app->add_flag("--causal", st->causal, "mask keys whose position exceeds the query's")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  app->add_flag("--keys-rotated", st->keys_rotated,
                "rope, mrope, xpos, rope2d axial: --k already holds the rotated keys (a cache filled by "
                "'posenc apply'); only q is rotated, and --grad-k is the rotated keys' gradient")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  app->add_flag("--float32-products", st->float32_products,
                "bfloat16 q, k, v: keep the float32 products (the same results on every CPU) instead of "
                "products on bfloat16 pairs where the CPU multiplies them (AMX; AVX512_BF16 on AMD)")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  st->scale_opt = add_text(app, "--scale", &st->scale, "multiplies q.k (default 1/sqrt(D))", "FLOAT");
  st->q_offset_opt =
      add_text(app, "--q-offset", &st->q_offset, "position of query 0 (default k-offset + N - M)", "INT");
  add_text(app, "--k-offset", &st->k_offset, "position of key 0 (default 0)", "INT");
  st->lse_opt =
      add_path(app, "--lse", &st->lse, "output: log-sum-exp of each row's logits, float64 [B, Hq, M]");
  st->grad_out_opt = add_path(app, "--grad-out", &st->grad_out, "upstream gradient dO [B, M, Hq, D]");
  st->grad_q_opt = add_path(app, "--grad-q", &st->grad_q, "output: gradient dQ");
  st->grad_k_opt = add_path(app, "--grad-k", &st->grad_k, "output: gradient dK");
  st->grad_v_opt = add_path(app, "--grad-v", &st->grad_v, "output: gradient dV");
  st->q_positions_opt = add_path(app, "--q-positions", &st->q_positions,
                                 "rope2d, mrope: query positions int32/int64 [A, M] or [B, A, M] (A = 2: x, y; "
                                 "3: t, h, w; default: q-offset + i in every component)");
  st->k_positions_opt = add_path(app, "--k-positions", &st->k_positions,
                                 "rope2d, mrope: key positions [A, N] or [B, A, N] (default: k-offset + j)");
  st->params.declare(app, in_attention, /*with_grads=*/true);
  return {app, [st] { run_attention(*st); }};
}

}  // namespace posenc::cli
