// posenc bias ENC --heads H --q-len M --k-len N [--q-offset a] [--k-offset b] [--causal] [params]
//             --out B.npy [--grad-out dB.npy --grad-weights dW.npy | --grad-r1 … | --grad-mlp-w1 … ]
// A logit-bias encoding's bias B [H, M, N] (query i at a + i, key j at b + j, with b = 0 and
// a = b + N − M by default, as posenc attention; −inf where a head may not look, and with --causal
// where the key's position exceeds the query's, as attention --causal masks), and the gradients of
// its learned tensors (masked entries pass none). B has the dtype of --weights (or --slopes,
// kerple's --r1, fire's --mlp-w2), else --dtype (default float64).
#include <cmath>

#include "cli/cli_common.h"

namespace posenc::cli {

namespace {

// The logit biases that depend on positions alone: the registry's bias kind but xl, whose term also
// reads q (it lives in attention).
bool has_bias(Encoding e) { return encoding_info(e).kind == Kind::kLogitBias && e != Encoding::kXL; }

struct BiasState {
  std::string enc, heads, q_len, k_len, q_offset, k_offset = "0", dtype, out, grad_out;
  bool causal = false;
  CLI::Option *dtype_opt = nullptr, *grad_out_opt = nullptr, *q_offset_opt = nullptr;
  ParamFlags params;
};

// The parameters of a bias call, by encoding.
struct BiasCall {
  AlibiParams alibi;
  T5Params t5;
  KerpleParams kerple;
  SandwichParams sandwich;
};

// The call's parameters from the flags, and the gradient and parameter flags checked against one
// another and the encoding before any file is read.
BiasCall params_from_flags(BiasState& st, const EncodingInfo& e, bool want_grads) {
  const std::vector<std::string> param_grads = st.params.grad_flags_given();
  if (!want_grads && !param_grads.empty())
    fail(Status::Invalid(param_grads.front(), "needs --grad-out (the upstream gradient dB [H, M, N])"));
  if (want_grads && param_grads.empty() && e.id == Encoding::kAlibi && st.params.choice("variant") != "learned")
    fail(Status::Invalid("--grad-out", "alibi --variant " + st.params.choice("variant") +
                                           " has no learned parameters: there is no gradient to compute (only "
                                           "--variant learned has one: --grad-weights FILE.npy)"));
  if (want_grads && param_grads.empty()) {
    std::string learned;  // the encoding's gradient outputs, from the registry
    for (const ParamSpec& ps : e.params)
      if (ps.learned) learned += (learned.empty() ? "" : " or ") + std::string("--grad-") + ps.name + " FILE.npy";
    fail(Status::Invalid("--grad-out", learned.empty() ? e.name + " has no learned parameters: there is no "
                                                                  "gradient to compute"
                                                       : "given without a gradient to compute: add " + learned));
  }

  BiasCall c;
  if (e.id == Encoding::kAlibi) {
    c.alibi = alibi_params(st.params);
    if (c.alibi.variant != AlibiVariant::kLearned && !st.params.grad_flags_given().empty())
      fail(Status::Invalid("--grad-weights", "only the learned variant has weights (got --variant " +
                                                 std::string(alibi_variant_name(c.alibi.variant)) + ")"));
    if (c.alibi.variant == AlibiVariant::kLearned && !st.params.given("weights"))
      fail(Status::Invalid("--weights", "is required for the learned variant: raw slopes [2, H]"));
  } else if (e.id == Encoding::kT5) {
    c.t5 = t5_params(st.params);
    check_lib(t5_validate(c.t5));
    if (!st.params.given("weights"))
      fail(Status::Invalid("--weights", "is required for t5: the bias table [--num-buckets, --heads]"));
  } else {
    // kerple, fire: every tensor parameter is required (sandwich has none)
    for (const ParamSpec& ps : e.params)
      if (ps.type == "tensor" && !st.params.given(ps.name))
        fail(Status::Invalid("--" + ps.name, "is required for " + e.name + ": " + ps.help));
  }
  if (e.id == Encoding::kKerple) c.kerple = kerple_params(st.params);
  if (e.id == Encoding::kSandwich) {
    c.sandwich = sandwich_params(st.params);
    check_lib(sandwich_validate(c.sandwich));  // before anything is allocated (--sinusoid-dim is bounded)
  }
  return c;
}

// out = the bias of the geometry g; with dbias (present), the parameters' gradients st.params asks for.
void compute_bias(BiasState& st, const EncodingInfo& e, const BiasCall& c, const BiasGeometry& g, const FlagMap& names,
                  const View& dbias, const View& out) {
  switch (e.id) {
    case Encoding::kAlibi:
      check_lib(alibi_bias(c.alibi, g, st.params.view("slopes"), st.params.view("weights"), out), names);
      if (dbias.present())
        check_lib(alibi_bias_backward(c.alibi, g, st.params.view("weights"), dbias,
                                      st.params.grad_view("weights")),
                  names);
      break;
    case Encoding::kT5:
      check_lib(t5_bias(c.t5, g, st.params.view("weights"), out), names);
      if (dbias.present()) check_lib(t5_bias_backward(c.t5, g, dbias, st.params.grad_view("weights")), names);
      break;
    case Encoding::kKerple:
      check_lib(kerple_bias(c.kerple, g, st.params.view("r1"), st.params.view("r2"), out), names);
      if (dbias.present())
        check_lib(kerple_bias_backward(c.kerple, g, st.params.view("r1"), st.params.view("r2"), dbias,
                                       st.params.grad_view("r1"), st.params.grad_view("r2")),
                  names);
      break;
    case Encoding::kSandwich:
      check_lib(sandwich_bias(c.sandwich, g, out), names);
      break;
    case Encoding::kFire: {
      const FireTensors t = encoding_tensors(st.params).fire;
      check_lib(fire_bias(FireParams{}, g, t, out), names);
      if (dbias.present())
        check_lib(fire_bias_backward(FireParams{}, g, t, dbias, encoding_grads(st.params).fire), names);
      break;
    }
    default:
      fail(Status::Internal("posenc bias has no glue for " + e.name));
  }
}

// Finite parameters can still overflow (FIRE's MLP with weights near the largest double): a bias of
// +inf or NaN (only masked entries are -inf) is refused, naming the parameters.
void check_finite_bias(BiasState& st, const EncodingInfo& e, const BiasGeometry& g, const Tensor& out) {
  const View v = out.view();
  for (std::int64_t i = 0; i < v.numel(); ++i) {
    const double b = v.get(i);
    if (!std::isnan(b) && b != HUGE_VAL) continue;
    std::string params;
    for (const ParamSpec& ps : e.params)
      if (ps.type == "tensor" && st.params.given(ps.name)) params += (params.empty() ? "--" : ", --") + ps.name;
    const std::int64_t h = i / (g.q_len * g.k_len), r = i % (g.q_len * g.k_len);
    fail(Status::OutOfRange(params.empty() ? "--heads" : params.substr(0, params.find(',')),
                            "the bias is " + std::string(std::isnan(b) ? "NaN" : "+inf") + " at head " +
                                std::to_string(h) + ", query " + std::to_string(r / g.k_len) + ", key " +
                                std::to_string(r % g.k_len) + ": expected " + e.name + " parameters" +
                                (params.empty() ? "" : " (" + params + ")") + " that keep it finite"));
  }
}

void run_bias(BiasState& st) {
  const EncodingInfo& e = st.params.bind(st.enc, "posenc bias");
  BiasGeometry g;
  g.heads = parse_int("--heads", st.heads);
  g.q_len = parse_int("--q-len", st.q_len);
  g.k_len = parse_int("--k-len", st.k_len);
  if (st.q_offset_opt->count() > 0) g.q_offset = parse_int("--q-offset", st.q_offset);  // else k_offset + N − M
  g.k_offset = parse_int("--k-offset", st.k_offset);
  g.causal = st.causal;  // the library masks B and takes no gradient from the masked entries of dB
  if (g.heads < 1)
    fail(Status::Invalid("--heads", "expected a positive integer, got " + std::to_string(g.heads)));
  if (g.q_len < 1)
    fail(Status::Invalid("--q-len", "expected a positive integer, got " + std::to_string(g.q_len)));
  if (g.k_len < 1)
    fail(Status::Invalid("--k-len", "expected a positive integer, got " + std::to_string(g.k_len)));
  // B [H, M, N]: a product too large names the factor out of range, not always the same flag.
  const std::vector<SizeFactor> size = {{"--heads", g.heads}, {"--q-len", g.q_len}, {"--k-len", g.k_len}};
  check_product(size);

  const bool want_grads = st.grad_out_opt->count() > 0;
  const BiasCall c = params_from_flags(st, e, want_grads);

  OutputSet outs;
  check(outs.reserve("--out", st.out));
  st.params.reserve_grads(&outs);

  // ---- inputs
  st.params.load_tensors();
  const char* dtype_from = nullptr;
  DType dtype = DType::kF64;
  for (const char* name : {"weights", "slopes", "r1", "mlp-w2"}) {
    if (dtype_from == nullptr && st.params.has(name) && st.params.tensor(name) != nullptr) {
      dtype = st.params.tensor(name)->dtype();
      dtype_from = name;
    }
  }
  if (e.id == Encoding::kFire && dtype_from != nullptr)  // one dtype for the MLP, as kerple's r1 and r2
    for (const ParamSpec& ps : e.params)
      if (ps.type == "tensor" && st.params.tensor(ps.name) != nullptr && st.params.tensor(ps.name)->dtype() != dtype)
        fail(Status::Invalid("--" + ps.name, std::string("expected ") + dtype_name(dtype) + " like --" + dtype_from +
                                                 ", got " + dtype_name(st.params.tensor(ps.name)->dtype())));
  if (st.dtype_opt->count() > 0) {
    const DType want = parse_float_dtype("--dtype", st.dtype);
    if (dtype_from != nullptr && want != dtype)
      fail(Status::Invalid("--dtype", std::string(dtype_name(want)) + " conflicts with --" + dtype_from +
                                          " (" + dtype_name(dtype) + "); the bias keeps its dtype"));
    dtype = want;
  }
  Tensor dbias;
  if (want_grads) {
    dbias = read_input("--grad-out", st.grad_out);
    require_float_tensor("--grad-out", dbias);
    // alibi, t5 and kerple take dB in their parameters' dtype (the library would name its own
    // arguments, "dweights ... like dbias"); fire takes any float dB.
    if (e.id != Encoding::kFire && dbias.dtype() != dtype)
      fail(Status::Invalid("--grad-out", std::string("expected ") + dtype_name(dtype) + " like the bias (" +
                                             (dtype_from ? std::string("the dtype of --") + dtype_from
                                                         : std::string("--dtype")) +
                                             "), got " + dtype_name(dbias.dtype())));
  }

  // ---- compute, then write
  const FlagMap names = {{"heads", "--heads"}, {"q_len", "--q-len"}, {"k_len", "--k-len"}};
  Tensor out;
  within_memory(size, [&] { out = Tensor(dtype, {g.heads, g.q_len, g.k_len}); });
  st.params.alloc_grads();
  compute_bias(st, e, c, g, names, want_grads ? dbias.view() : View{}, out.view());
  check_finite_bias(st, e, g, out);
  outs.attach("--out", &out);
  st.params.attach_grads(&outs);
  check(outs.commit());
}

}  // namespace

Command add_bias_command(CLI::App& root) {
  auto st = std::make_shared<BiasState>();
  CLI::App* app = root.add_subcommand(
      "bias", "write a logit-bias encoding's bias [H, M, N] (" + encoding_names(has_bias) + ")");
  app->allow_extras();
  app->add_option("ENC", st->enc, "the encoding: " + encoding_names(has_bias))->required();
  add_text(app, "--heads", &st->heads, "number of heads H", "INT")->required();
  add_text(app, "--q-len", &st->q_len, "number of queries M", "INT")->required();
  add_text(app, "--k-len", &st->k_len, "number of keys N", "INT")->required();
  st->q_offset_opt =
      add_text(app, "--q-offset", &st->q_offset, "position of query 0 (default k-offset + N - M, as attention)", "INT");
  add_text(app, "--k-offset", &st->k_offset, "position of key 0 (default 0)", "INT");
  app->add_flag("--causal", st->causal, "-inf where the key's position exceeds the query's (as attention --causal)");
  st->dtype_opt = add_text(app, "--dtype", &st->dtype,
                           "float32 or float64 (default: the dtype of --weights, --slopes, --r1 or --mlp-w2, else float64)",
                           "float32|float64");
  add_path(app, "--out", &st->out, "output bias [H, M, N], -inf where masked")->required();
  st->grad_out_opt = add_path(app, "--grad-out", &st->grad_out, "upstream gradient dB [H, M, N]");
  st->params.declare(app, has_bias, /*with_grads=*/true);
  return {app, [st] { run_bias(*st); }};
}

}  // namespace posenc::cli
