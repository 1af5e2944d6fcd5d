// posenc table ENC --length L --dim D [--offset K] [params] [--dtype float32|float64] --out T.npy
// A table that is a function of position alone, rows for positions K .. K+L−1:
//   sinusoidal: the absolute encoding [L, D];
//   rope: [L, r/2], per pair k the angle of position K + l (--part angle, the default: m·ω_k in
//         double, or transformers' float32 product with --angles hf), or a·cos, a·sin of it (--part
//         cos | sin, a the attention factor), as the rotation uses them. --dim is the head dimension
//         (taken from --config when that is given).
//   rope2d, mrope, xpos (rotary.h): [L, r/2] (rope2d mixed: [H, L, r/2], H from --freqs) for the
//         tokens at --positions ([2, L] (x, y), [3, L] (t, h, w), xpos [L]) or at K .. K+L−1 in every
//         component: --part angle (φ), cos, sin (a·ρ·cos φ, a·ρ·sin φ: what the rotation multiplies),
//         scale (a·ρ; xpos: --role query (default) or key). rope2d --variant mixed --part init
//         --heads H [--seed S]: the authors' initialisation of the frequencies [2, H, r/2], its
//         per-head angles uniform in [0, 2π) from std::mt19937_64(S) (53-bit uniforms).
// D is at most 2^20 and a table at most 2^34 values; a failure names the flag out of range.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "cli/cli_common.h"

namespace posenc::cli {

namespace {

// The encodings whose table is a function of position alone: sinusoidal and the registry's rotary
// ones.
bool has_table(Encoding e) { return e == Encoding::kSinusoidal || encoding_info(e).kind == Kind::kRotary; }

struct TableState {
  std::string enc, length, dim, offset = "0", dtype = "float64", out, part = "angle";
  std::string positions, role = "query", heads, seed = "0";
  CLI::Option *dim_opt = nullptr, *part_opt = nullptr, *length_opt = nullptr, *positions_opt = nullptr,
              *offset_opt = nullptr, *role_opt = nullptr, *heads_opt = nullptr, *seed_opt = nullptr;
  ParamFlags params;
};

// A head dimension (or sinusoidal's model dimension) beyond 2^20 is a typo; refused before the
// library allocates its frequencies (D/2 of them) or a table.
constexpr std::int64_t kMaxDim = std::int64_t{1} << 20;

std::int64_t parse_dim(const std::string& text) {
  const std::int64_t D = parse_int("--dim", text);
  if (D > kMaxDim)
    fail(Status::OutOfRange("--dim", "expected a dimension <= 2^20 (1048576), got " + std::to_string(D)));
  return D;
}

// The flag that sets the rotary dimension r (for messages): --rotary-dim, else --config's, else D.
std::string rotary_flag(const ParamFlags& f) {
  return f.given("rotary-dim") ? "--rotary-dim" : f.given("config") ? "--config" : "--dim";
}

// The table's r/2 pairs per position as a factor of its size, named by the flag that set r.
SizeFactor pairs_factor(const ParamFlags& f, std::int64_t pairs) {
  const std::string flag = rotary_flag(f);
  return {flag, std::max<std::int64_t>(1, pairs), flag == "--config" ? "r/2 (r from --config)" : flag + "/2"};
}

// r/2, the pairs a rotary table has per position, as far as the flags tell before the library checks
// them (it refuses an r outside [2, D] itself).
std::int64_t pairs_of(const RopeParams& rope, std::int64_t D) {
  const std::int64_t r = rope.rotary_dim == 0 ? D : std::min(rope.rotary_dim, D);
  return std::max<std::int64_t>(1, r / 2);
}

// A float32 table holds its values only below 2^128: an angle past that (a tiny --theta, a huge
// frequency) is refused, not written as inf.
void check_fits(DType dtype, double x, std::int64_t row, std::int64_t pair) {
  if (dtype != DType::kF32 || std::fabs(x) <= double(std::numeric_limits<float>::max())) return;
  char msg[200];
  std::snprintf(msg, sizeof msg,
                "the value %.6g at row %lld, pair %lld does not fit float32; expected --dtype float64 (or "
                "frequencies whose angles stay below 3.4e38)",
                x, (long long)row, (long long)pair);
  fail(Status::OutOfRange("--dtype", msg));
}

// rope2d mixed --part init: its initial frequencies [2, H, r/2] for --heads H from --seed.
void rope2d_init_table(TableState& st, std::int64_t D, const FlagMap& names, DType dtype, OutputSet* outs,
                       Tensor* table) {
  const bool have_pos = st.positions_opt->count() > 0, have_len = st.length_opt->count() > 0;
  if (have_pos || have_len || st.offset_opt->count() > 0)
    fail(Status::Invalid(have_pos ? "--positions" : have_len ? "--length" : "--offset",
                         "--part init takes no positions (only --heads, --dim, --rotary-dim, --theta, --seed)"));
  if (st.heads_opt->count() == 0) fail(Status::Invalid("--heads", "is required for --part init: the heads H"));
  if (st.params.given("freqs"))
    fail(Status::Invalid("--freqs", "--part init writes the initial frequencies; it reads none"));
  const std::int64_t H = parse_int("--heads", st.heads), seed = parse_int("--seed", st.seed);
  if (H < 1 || H > (std::int64_t{1} << 20))
    fail(Status::Invalid("--heads", "expected 1 .. 2^20 heads, got " + std::to_string(H)));
  const Rope2dParams p = rope2d_params(st.params);
  const std::int64_t r = p.rope.rotary_dim == 0 ? D : p.rope.rotary_dim;
  if (r > D)
    fail(Status::Invalid("--rotary-dim", "expected at most D = " + std::to_string(D) + ", got " + std::to_string(r)));
  const std::vector<SizeFactor> size = {{"--heads", H}, pairs_factor(st.params, r / 2)};
  check_product(size);
  std::mt19937_64 gen(static_cast<std::uint64_t>(seed));
  std::vector<double> angles(static_cast<std::size_t>(H));
  for (double& a : angles) a = 2 * M_PI * (static_cast<double>(gen() >> 11) * 0x1.0p-53);
  within_memory(size, [&] {
    const std::vector<double> f = take_lib(rope2d_mixed_init(H, r, p.rope.theta, angles), names);
    check(outs->reserve("--out", st.out));
    *table = Tensor(dtype, {2, H, r / 2});
    from_doubles(f, table->view());
  });
}

// rope2d, mrope, xpos: the table of the plan (rotary.h), or rope2d mixed's initialisation.
void rotary_table(TableState& st, const EncodingInfo& e, DType dtype, OutputSet* outs, Tensor* table) {
  const bool have_pos = st.positions_opt->count() > 0, have_len = st.length_opt->count() > 0;
  const std::string part = st.part;
  const bool is_init = part == "init";
  if (part != "angle" && part != "cos" && part != "sin" && part != "scale" && !is_init)
    fail(Status::Invalid("--part", "expected angle, cos, sin or scale (rope2d mixed: init), got '" + part + "'"));
  if (is_init && !(e.id == Encoding::kRope2d && st.params.choice("variant") == "mixed"))
    fail(Status::Invalid("--part", "init is rope2d mixed's initialisation of its frequencies (--variant mixed)"));
  if (!is_init && (st.heads_opt->count() > 0 || st.seed_opt->count() > 0))
    fail(Status::Invalid(st.heads_opt->count() > 0 ? "--heads" : "--seed",
                         "only rope2d --variant mixed --part init takes it (the initial frequencies of H heads)"));
  if (st.role_opt->count() > 0 && e.id != Encoding::kXpos)
    fail(Status::Invalid("--role", "only xpos takes it (its scale differs between queries and keys); " + e.name +
                                       "'s table is the same for both"));
  if (st.dim_opt->count() == 0) fail(Status::Invalid("--dim", "is required for " + e.name + ": the head dimension D"));
  const std::int64_t D = parse_dim(st.dim);
  if (D < 1) fail(Status::Invalid("--dim", "expected a head dimension >= 1, got " + std::to_string(D)));
  FlagMap names = {{"head_dim", "--dim"}, {"length", "--length"}, {"heads", "--heads"}};
  for (auto& n : rope_names(st.params, "--dim")) names.push_back(n);
  if (is_init) return rope2d_init_table(st, D, names, dtype, outs, table);
  if (have_pos && have_len) fail(Status::Invalid("--length", "cannot be combined with --positions (L is theirs)"));
  if (have_pos && st.offset_opt->count() > 0)
    fail(Status::Invalid("--offset", "cannot be combined with --positions (give one or the other)"));
  if (!have_pos && !have_len)
    fail(Status::Invalid("--length", "is required (or --positions): the number of positions L"));
  Tensor ids;
  std::int64_t L = 0;
  const std::int64_t offset = parse_int("--offset", st.offset);
  if (have_pos) {
    ids = read_positions("--positions", st.positions);
    if (ids.shape().empty()) fail(Status::Invalid("--positions", "expected an array of positions, got a scalar"));
    L = ids.shape().back();
  } else {
    L = parse_int("--length", st.length);
    if (L < 1) fail(Status::Invalid("--length", "expected a positive integer, got " + std::to_string(L)));
    if (offset < 0) fail(Status::Invalid("--offset", "expected a position >= 0, got " + std::to_string(offset)));
    if (offset > kMaxPosition - (L - 1))  // the last position, offset + length − 1, within view.h's bound
      fail(Status::OutOfRange("--offset", "expected offset + length - 1 <= 2^53, got " + std::to_string(offset)));
  }
  check(outs->reserve("--out", st.out));
  st.params.load_tensors();
  const Positions pos{have_pos ? ids.view() : View{}, have_pos ? 0 : offset};
  FlagMap pnames = names;
  // positions out of range: the flag that placed them (xPos's scale around a given --center is its)
  const bool center_given = e.id == Encoding::kXpos && st.params.given("center");
  pnames.push_back({"positions", have_pos                    ? "--positions"
                                 : st.offset_opt->count() > 0 ? "--offset"
                                 : center_given               ? "--center"
                                                              : "--length"});
  // The parameters first, so that the table's size [H,] L, r/2 is checked before the library
  // allocates positions, angles and scales for it.
  Rope2dParams p2;
  MropeParams pm;
  XposParams px;
  XposRole role = XposRole::kQuery;
  std::vector<SizeFactor> size;
  if (e.id == Encoding::kRope2d) {
    p2 = rope2d_params(st.params);
    if (p2.variant == Rope2dVariant::kMixed && !st.params.given("freqs"))
      fail(Status::Invalid("--freqs", "is required for rope2d mixed's table: its frequencies [2, H, r/2]"));
    const Tensor* fr = st.params.tensor("freqs");
    if (fr != nullptr && fr->shape().size() == 3 && fr->shape()[1] > 1)
      size.push_back({"--freqs", fr->shape()[1], "H (from --freqs)"});
  } else if (e.id == Encoding::kMrope) {
    pm = mrope_params(st.params);
  } else {
    px = xpos_params(st.params);
    role = take_lib(parse_xpos_role(st.role));
  }
  const RopeParams& rope = e.id == Encoding::kRope2d ? p2.rope : e.id == Encoding::kMrope ? pm.rope : px.rope;
  size.push_back({have_pos ? "--positions" : "--length", std::max<std::int64_t>(1, L)});
  size.push_back(pairs_factor(st.params, pairs_of(rope, D)));
  check_product(size);
  within_memory(size, [&] {
    RotaryTable t;
    if (e.id == Encoding::kRope2d)
      t = take_lib(rope2d_table(p2, D, L, pos, st.params.view("freqs")), pnames);
    else if (e.id == Encoding::kMrope)
      t = take_lib(mrope_table(pm, D, L, pos), pnames);
    else
      t = take_lib(xpos_table(px, role, D, L, pos,  // the scales (a·ρ·cos, a·ρ·sin) must fit the dtype
                              part == "angle" ? std::nullopt : std::optional<DType>(dtype)),
                   pnames);
    std::vector<double> v(t.angle.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double a = t.angle[i], sc = t.scale[i];
      v[i] = part == "angle" ? a : part == "cos" ? sc * std::cos(a) : part == "sin" ? sc * std::sin(a) : sc;
      const std::int64_t at = std::int64_t(i) / t.pairs;
      check_fits(dtype, v[i], at % t.length, std::int64_t(i) % t.pairs);
    }
    const bool per_head = e.id == Encoding::kRope2d && p2.variant == Rope2dVariant::kMixed;
    *table = per_head ? Tensor(dtype, {t.heads, t.length, t.pairs}) : Tensor(dtype, {t.length, t.pairs});
    from_doubles(v, table->view());
  });
}

void run_table(TableState& st) {
  const EncodingInfo& e = st.params.bind(st.enc, "posenc table");
  if (e.id == Encoding::kRope2d || e.id == Encoding::kMrope || e.id == Encoding::kXpos) {
    const DType dtype = parse_float_dtype("--dtype", st.dtype);
    OutputSet outs;
    Tensor table;
    rotary_table(st, e, dtype, &outs, &table);
    outs.attach("--out", &table);
    check(outs.commit());
    return;
  }
  // The options of the rotary tables, said in the user's terms: which encodings take them, and why
  // this one does not.
  if (st.positions_opt->count() > 0)
    fail(Status::Invalid("--positions", "only rope2d, mrope and xpos take it; " + e.name +
                                            "'s rows are the positions --offset .. --offset + --length - 1"));
  if (st.role_opt->count() > 0)
    fail(Status::Invalid("--role", "only xpos takes it (its scale differs between queries and keys); " + e.name +
                                       "'s table does not depend on it"));
  for (auto [flag, opt] : {std::pair{"--heads", st.heads_opt}, std::pair{"--seed", st.seed_opt}})
    if (opt->count() > 0)
      fail(Status::Invalid(flag, "only rope2d --variant mixed --part init takes it (the initial frequencies of "
                                 "H heads); " + e.name + "'s table has no heads"));
  if (st.length_opt->count() == 0) fail(Status::Invalid("--length", "is required: the number of positions L"));
  const std::int64_t L = parse_int("--length", st.length);
  const std::int64_t offset = parse_int("--offset", st.offset);
  const DType dtype = parse_float_dtype("--dtype", st.dtype);
  if (L < 1) fail(Status::Invalid("--length", "expected a positive integer, got " + std::to_string(L)));
  if (offset < 0)
    fail(Status::Invalid("--offset", "expected a position >= 0, got " + std::to_string(offset)));
  if (e.id != Encoding::kRope && st.part_opt->count() > 0)
    fail(Status::Invalid("--part", e.name + "'s table has no parts (rope, rope2d, mrope and xpos take it)"));
  const bool have_dim = st.dim_opt->count() > 0;
  std::int64_t D = have_dim ? parse_dim(st.dim) : 0;

  FlagMap names = {{"out", "--out"}, {"offset", "--offset"}, {"positions", "--offset"},
                   {"head_dim", have_dim ? "--dim" : "--config"}};
  for (auto& n : rope_names(st.params, have_dim ? "--dim" : "--config")) names.push_back(n);
  OutputSet outs;
  Tensor table;
  switch (e.id) {
    case Encoding::kSinusoidal: {
      if (!have_dim) fail(Status::Invalid("--dim", "is required for sinusoidal: the model dimension D"));
      if (D < 2 || D % 2 != 0)
        fail(Status::Invalid("--dim", "expected a positive even integer, got " + std::to_string(D)));
      const std::vector<SizeFactor> size = {{"--length", L}, {"--dim", D}};
      check_product(size);
      check(outs.reserve("--out", st.out));
      within_memory(size, [&] { table = Tensor(dtype, {L, D}); });
      check_lib(sinusoidal_table(sinusoidal_params(st.params), Positions{View{}, offset}, table.view()), names);
      break;
    }
    case Encoding::kRope: {
      if (st.part != "angle" && st.part != "cos" && st.part != "sin")
        fail(Status::Invalid("--part", "expected angle, cos or sin, got '" + st.part + "'"));
      if (st.part == "angle" && st.params.given("attention-factor"))  // a multiplies cos and sin only
        fail(Status::Invalid("--attention-factor", "not read by --part angle (it multiplies cos and sin)"));
      if (offset > kMaxPosition - (L - 1))  // the last position within view.h's bound (exact in double)
        fail(Status::OutOfRange("--offset", "expected offset + length - 1 <= 2^53, got " + std::to_string(offset)));
      check(outs.reserve("--out", st.out));
      st.params.load_tensors();
      std::int64_t config_D = 0;
      const RopeParams p = rope_params(st.params, &config_D);
      if (config_D != 0 && have_dim && D != config_D)
        fail(Status::Invalid("--dim", "expected the head dimension of --config, " + std::to_string(config_D) +
                                          ", got " + std::to_string(D)));
      if (!have_dim) {
        if (config_D == 0) fail(Status::Invalid("--dim", "is required for rope: the head dimension D"));
        D = config_D;
        if (D > kMaxDim)
          fail(Status::OutOfRange("--config", "expected a head dimension <= 2^20 (1048576), got " + std::to_string(D)));
      }
      if (D < 2) fail(Status::Invalid("--dim", "expected a head dimension >= 2, got " + std::to_string(D)));
      auto fr = rope_frequencies(p, D, offset + L);
      check_lib(fr.status(), names);
      const RopeFrequencies& f = *fr;
      const std::int64_t half = f.rotary_dim / 2;
      const std::vector<SizeFactor> size = {{"--length", L}, pairs_factor(st.params, half)};
      check_product(size);
      within_memory(size, [&] { table = Tensor(dtype, {L, half}); });
      const View v = table.view();
      for (std::int64_t l = 0; l < L; ++l)
        for (std::int64_t k = 0; k < half; ++k) {
          const double a = f.angle(offset + l, k);
          const double x = st.part == "angle" ? a : f.attention_factor * (st.part == "cos" ? std::cos(a) : std::sin(a));
          check_fits(dtype, x, l, k);
          v.set(l * half + k, x);
        }
      break;
    }
    default:
      fail(Status::Internal("no table for " + e.name));
  }
  outs.attach("--out", &table);
  check(outs.commit());
}

}  // namespace

Command add_table_command(CLI::App& root) {
  auto st = std::make_shared<TableState>();
  CLI::App* app = root.add_subcommand(
      "table", "write a table of positions: sinusoidal [L, D]; rope's angles (or a*cos, a*sin) [L, r/2] (" +
                   encoding_names(has_table) + ")");
  app->allow_extras();
  app->add_option("ENC", st->enc, "the encoding: " + encoding_names(has_table))->required();
  st->length_opt = add_text(app, "--length", &st->length, "number of positions L (or --positions)", "INT");
  st->dim_opt = add_text(app, "--dim", &st->dim,
                         "model dimension D (even; sinusoidal) or head dimension D (rope; default: from --config)", "INT");
  st->offset_opt = add_text(app, "--offset", &st->offset, "first position K (default 0)", "INT");
  st->positions_opt = add_path(app, "--positions", &st->positions,
                               "rope2d, mrope, xpos: positions [2, L] (x, y), [3, L] (t, h, w) or [L] (instead "
                               "of --length, --offset)");
  st->role_opt = add_text(app, "--role", &st->role, "xpos: the scale of queries (default) or keys", "query|key");
  st->heads_opt = add_text(app, "--heads", &st->heads, "rope2d mixed, --part init: the heads H", "INT");
  st->seed_opt = add_text(app, "--seed", &st->seed, "rope2d mixed, --part init: the angles' seed (default 0)", "INT");
  add_text(app, "--dtype", &st->dtype, "float32 or float64 (default float64)", "float32|float64");
  st->part_opt = add_text(app, "--part", &st->part,
                          "rope: angle (default), cos or sin (times the attention factor); rope2d, mrope, xpos also "
                          "scale (a*rho), rope2d mixed init",
                          "angle|cos|sin|scale|init");
  add_path(app, "--out", &st->out, "output table")->required();
  st->params.declare(app, has_table, /*with_grads=*/false);
  return {app, [st] { run_table(*st); }};
}

}  // namespace posenc::cli
