// posenc apply ENC --in X.npy --out Y.npy [--positions P.npy | --offset K] [--role query|key] [params]
//              [--grad-out dY.npy --grad-in dX.npy [--grad-table dE.npy] [--grad-freqs dF.npy]]
// Encodings that act on a tensor by themselves: rope rotates X [B, L, H, D] (any scheme of rope.h,
// or the RoPE of a Hugging Face config.json with --config); rope2d, mrope and xpos (rotary.h) rotate
// X [B, L, H, D] by positions [2, L] / [B, 2, L] (x, y), [3, L] / [B, 3, L] (t, h, w), [L] / [B, L]
// (xpos, whose --role says whether X holds queries or keys); sinusoidal and learned add to
// embeddings X [B, L, D]; nope passes X through. Y keeps X's dtype.
#include <cmath>
#include <tuple>

#include "cli/cli_common.h"

namespace posenc::cli {

namespace {

// The baseline and the encodings the registry classes as absolute (added to embeddings) or rotary
// (applied to queries or keys): those that act on a tensor by themselves.
bool applies(Encoding e) {
  const Kind k = encoding_info(e).kind;
  return k == Kind::kNone || k == Kind::kAbsolute || k == Kind::kRotary;
}

struct ApplyState {
  std::string enc, in, out, positions, offset = "0", grad_out, grad_in, role;
  CLI::Option *positions_opt = nullptr, *offset_opt = nullptr, *grad_out_opt = nullptr,
              *grad_in_opt = nullptr, *role_opt = nullptr;
  ParamFlags params;
};

void require_like(const std::string& flag, const Tensor& t, const Tensor& ref, const std::string& ref_flag) {
  if (t.shape() != ref.shape())
    fail(Status::Invalid(
        flag, "expected shape " + ref.shape_str() + " like " + ref_flag + ", got " + t.shape_str()));
  if (t.dtype() != ref.dtype())
    fail(Status::Invalid(flag, std::string("expected ") + dtype_name(ref.dtype()) + " like " + ref_flag +
                                   ", got " + dtype_name(t.dtype())));
}

// What run_apply reads from the flags, checked against one another before any file is read.
struct ApplyFlags {
  bool have_positions = false, want_grads = false, want_dx = false;  // want_dx: --grad-in
  std::int64_t offset = 0;
  XposRole role = XposRole::kQuery;
};

ApplyFlags check_flags(ApplyState& st, const EncodingInfo& e) {
  const bool have_positions = st.positions_opt->count() > 0;
  const bool want_grads = st.grad_out_opt->count() > 0;
  const std::vector<std::string> param_grads = st.params.grad_flags_given();
  if (have_positions && st.offset_opt->count() > 0)
    fail(Status::Invalid("--offset", "cannot be combined with --positions (give one or the other)"));
  if (e.id == Encoding::kNope && (have_positions || st.offset_opt->count() > 0))  // y = x: no position read
    fail(Status::Invalid(have_positions ? "--positions" : "--offset", "not read by nope, which adds no position"));
  if (!want_grads) {
    if (st.grad_in_opt->count() > 0)
      fail(Status::Invalid("--grad-in", "needs --grad-out (the upstream gradient dY)"));
    if (!param_grads.empty())
      fail(Status::Invalid(param_grads.front(), "needs --grad-out (the upstream gradient dY)"));
  } else if (st.grad_in_opt->count() == 0 && param_grads.empty()) {
    fail(Status::Invalid("--grad-out",
                         "given without a gradient to compute: add --grad-in dX.npy" +
                             std::string(st.params.has("table")   ? " or --grad-table dE.npy"
                                         : st.params.has("freqs") ? " or --grad-freqs dF.npy (rope2d mixed)"
                                                                  : "")));
  }
  const std::int64_t offset = parse_int("--offset", st.offset);
  if (offset < 0)
    fail(Status::Invalid("--offset", "expected a position >= 0, got " + std::to_string(offset)));
  if (e.id == Encoding::kLearned && !st.params.given("table"))
    fail(Status::Invalid("--table", "is required for learned: the table E [max_len, D]"));
  XposRole role = XposRole::kQuery;
  if (e.id == Encoding::kXpos) {
    if (st.role_opt->count() == 0)
      fail(Status::Invalid("--role", "is required for xpos: query (scaled by zeta^((m-c)/s)) or key "
                                     "(zeta^(-(m-c)/s))"));
    role = take_lib(parse_xpos_role(st.role));
  } else if (st.role_opt->count() > 0) {
    fail(Status::Invalid("--role", "only xpos scales queries and keys differently (got " + e.name + ")"));
  }
  if (e.id == Encoding::kRope2d) {
    const bool mixed = st.params.choice("variant") == "mixed";
    if (mixed && !st.params.given("freqs"))
      fail(Status::Invalid("--freqs", "is required for rope2d mixed: the learned frequencies [2, H, r/2] "
                                      "(posenc table rope2d --variant mixed --part init writes the paper's "
                                      "initialisation)"));
    if (!mixed && !st.params.grad_flags_given().empty())
      fail(Status::Invalid("--grad-freqs", "only rope2d mixed has learned frequencies (got --variant axial)"));
  }

  return ApplyFlags{have_positions, want_grads, want_grads && st.grad_in_opt->count() > 0, offset, role};
}

// y = the encoding applied to x; with want_dx, dx from dy (and the parameter gradients st.params
// asks for).
void apply_encoding(ApplyState& st, const EncodingInfo& e, const ApplyFlags& f, const Tensor& x, const Tensor& dy,
                    const Positions& pos, const FlagMap& names, Tensor* y, Tensor* dx) {
  const bool want_dx = f.want_dx;
  const View dx_view = want_dx ? dx->view() : View{};
  switch (e.id) {
    case Encoding::kNope:
      *y = x;
      if (want_dx) *dx = dy;
      break;
    case Encoding::kSinusoidal: {
      const SinusoidalParams p = sinusoidal_params(st.params);
      check_lib(sinusoidal_forward(p, x.view(), pos, y->view()), names);
      if (want_dx) check_lib(sinusoidal_backward(p, dy.view(), pos, dx_view), names);
      break;
    }
    case Encoding::kLearned: {
      const LearnedParams p;
      const View table = st.params.view("table");
      // a parameter, checked as every encoding's parameters are (data inputs pass NaN through)
      for (std::int64_t i = 0; table.ndim == 2 && i < table.numel(); ++i)  // (its shape: the library's check)
        if (!std::isfinite(table.get(i)))
          fail(Status::Invalid("--table", "expected finite values, got a non-finite one at row " +
                                              std::to_string(i / table.shape[1]) + ", column " +
                                              std::to_string(i % table.shape[1])));
      // more positions than the table has rows: the table is too short for --in (a start past its end
      // within that is --offset's, as the library says)
      if (!f.have_positions && x.shape().size() >= 2 && table.ndim == 2) {
        const std::int64_t L = x.shape()[x.shape().size() - 2], rows = table.shape[0];
        if (L > rows)
          fail(Status::OutOfRange("--table", "has " + std::to_string(rows) + " rows (max_len), fewer than --in's " +
                                                 std::to_string(L) + " positions"));
      }
      check_lib(learned_forward(p, x.view(), table, pos, y->view()), names);
      if (f.want_grads)
        check_lib(learned_backward(p, dy.view(), table, pos, dx_view, st.params.grad_view("table")), names);
      break;
    }
    case Encoding::kRope: {
      std::int64_t config_D = 0;
      const RopeParams p = rope_params(st.params, &config_D);
      if (config_D != 0 && x.shape().size() == 4 && x.shape()[3] != config_D)
        fail(Status::Invalid("--in", "expected head dimension D = " + std::to_string(config_D) +
                                         " (from --config), got shape " + x.shape_str()));
      check_lib(rope_forward(p, x.view(), pos, y->view()), names);
      if (want_dx) check_lib(rope_backward(p, dy.view(), pos, dx_view), names);
      break;
    }
    case Encoding::kRope2d: {
      const Rope2dParams p = rope2d_params(st.params);
      const View freqs = st.params.view("freqs");
      check_lib(rope2d_forward(p, x.view(), pos, freqs, y->view()), names);
      const View dfreqs = st.params.grad_view("freqs");
      if (f.want_grads)
        check_lib(rope2d_backward(p, dy.view(), pos, freqs, dx_view, dfreqs.present() ? x.view() : View{}, dfreqs),
                  names);
      break;
    }
    case Encoding::kMrope: {
      std::int64_t config_D = 0;
      const MropeParams p = mrope_params(st.params, &config_D);
      if (config_D != 0 && x.shape().size() == 4 && x.shape()[3] != config_D)
        fail(Status::Invalid("--in", "expected head dimension D = " + std::to_string(config_D) +
                                         " (from --config), got shape " + x.shape_str()));
      check_lib(mrope_forward(p, x.view(), pos, y->view()), names);
      if (want_dx) check_lib(mrope_backward(p, dy.view(), pos, dx_view), names);
      break;
    }
    case Encoding::kXpos: {
      const XposParams p = xpos_params(st.params);
      check_lib(xpos_forward(p, f.role, x.view(), pos, y->view()), names);
      if (want_dx) check_lib(xpos_backward(p, f.role, dy.view(), pos, dx_view), names);
      break;
    }
    default:
      fail(Status::Internal("posenc apply has no glue for " + e.name));
  }

}

// Finite inputs whose result leaves the dtype's range (values near its largest, a large
// --attention-factor or xPos scale) are an error, not an inf in the output. NaN and inf already in
// --in or --grad-out pass through, as in every float computation.
void check_overflow(ApplyState& st, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
                    bool want_dx) {
  const auto first_nonfinite = [](const Tensor& t) -> std::int64_t {
    const View v = t.view();
    for (std::int64_t i = 0; i < v.numel(); ++i)
      if (!std::isfinite(v.get(i))) return i;
    return -1;
  };
  for (const auto& [out_flag, res, in_flag, src] :
       {std::tuple<const char*, const Tensor*, const char*, const Tensor*>{"--out", &y, "--in", &x},
        std::tuple<const char*, const Tensor*, const char*, const Tensor*>{"--grad-in", &dx, "--grad-out", &dy}}) {
    if (res->numel() == 0 || (res == &dx && !want_dx)) continue;
    const std::int64_t at = first_nonfinite(*res);
    if (at < 0 || first_nonfinite(*src) >= 0) continue;
    const bool factor = st.params.has("attention-factor") && st.params.given("attention-factor");
    fail(Status::OutOfRange(factor ? "--attention-factor" : in_flag,
                            std::string(out_flag) + " would overflow " + dtype_name(res->dtype()) + " at flat index " +
                                std::to_string(at) + " (finite " + in_flag + " times the encoding's factors): " +
                                (factor ? "expected a smaller --attention-factor" : "expected smaller values in " +
                                                                                       std::string(in_flag))));
  }
}

void run_apply(ApplyState& st) {
  const EncodingInfo& e = st.params.bind(st.enc, "posenc apply");
  const ApplyFlags f = check_flags(st, e);
  const bool have_positions = f.have_positions, want_grads = f.want_grads;

  OutputSet outs;
  check(outs.reserve("--out", st.out));
  if (st.grad_in_opt->count() > 0) check(outs.reserve("--grad-in", st.grad_in));
  st.params.reserve_grads(&outs);

  // ---- inputs
  const Tensor x = read_input("--in", st.in);
  require_float_tensor("--in", x);
  require_feature_dim("--in", x);
  Tensor ids;
  if (have_positions) ids = read_positions("--positions", st.positions);
  const Positions pos{have_positions ? ids.view() : View{}, have_positions ? 0 : f.offset};
  st.params.load_tensors();
  Tensor dy;
  if (want_grads) {
    dy = read_input("--grad-out", st.grad_out);
    require_float_tensor("--grad-out", dy);
    require_like("--grad-out", dy, x, "--in");
  }

  // ---- compute everything before writing anything
  // Positions the user did not give (0 .. L-1 of --in) out of range: xPos's scale around a --center
  // that was given is that flag's doing.
  const bool center_given = e.id == Encoding::kXpos && st.params.given("center");
  FlagMap names = {{"positions", have_positions                  ? "--positions"
                                 : st.offset_opt->count() > 0 ? "--offset"
                                 : center_given               ? "--center"
                                                              : "--in"}, {"offset", "--offset"}};
  // an unset rotary_dim is the input's D: a head dim the rotary encodings refuse is --in's
  if (e.id == Encoding::kRope || e.id == Encoding::kRope2d || e.id == Encoding::kMrope || e.id == Encoding::kXpos)
    for (auto& n : rope_names(st.params, "--in")) names.push_back(n);
  Tensor y(x.dtype(), x.shape());
  const bool want_dx = f.want_dx;
  Tensor dx;
  if (want_dx) dx = Tensor(x.dtype(), x.shape());
  st.params.alloc_grads();

  apply_encoding(st, e, f, x, dy, pos, names, &y, &dx);
  check_overflow(st, x, y, dy, dx, want_dx);
  outs.attach("--out", &y);
  if (want_dx) outs.attach("--grad-in", &dx);
  st.params.attach_grads(&outs);
  check(outs.commit());
}

}  // namespace

Command add_apply_command(CLI::App& root) {
  auto st = std::make_shared<ApplyState>();
  CLI::App* app = root.add_subcommand("apply", "apply an encoding by itself (" + encoding_names(applies) +
                                                   "): rotary X [B, L, H, D], absolute X [B, L, D] + PE");
  app->allow_extras();
  app->add_option("ENC", st->enc, "the encoding: " + encoding_names(applies))->required();
  add_path(app, "--in", &st->in, "input X: [B, L, H, D] for the rotary encodings, [B, L, D] for absolute ones")
      ->required();
  add_path(app, "--out", &st->out, "output Y, X's shape and dtype")->required();
  st->positions_opt = add_path(app, "--positions", &st->positions,
                               "token positions, int32/int64 [L] or [B, L]; rope2d [2, L] or [B, 2, L] (x, y); "
                               "mrope [3, L] or [B, 3, L] (t, h, w) (default offset + l in every component)");
  st->role_opt = add_text(app, "--role", &st->role, "xpos: X holds queries (scaled up) or keys (scaled down)",
                          "query|key");
  st->offset_opt = add_text(app, "--offset", &st->offset, "position of the first token (default 0)", "INT");
  st->grad_out_opt = add_path(app, "--grad-out", &st->grad_out, "upstream gradient dY (X's shape)");
  st->grad_in_opt = add_path(app, "--grad-in", &st->grad_in, "output: gradient dX");
  st->params.declare(app, applies, /*with_grads=*/true);
  return {app, [st] { run_apply(*st); }};
}

}  // namespace posenc::cli
