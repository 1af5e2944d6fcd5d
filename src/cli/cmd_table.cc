// posenc table ENC --length L --dim D [--offset K] [params] [--dtype float32|float64] --out T.npy
// A table that is a function of position alone, rows for positions K .. K+L−1:
//   sinusoidal: the absolute encoding [L, D];
//   rope: [L, r/2], per pair k the angle of position K + l (--part angle, the default: m·ω_k in
//         double, or transformers' float32 product with --angles hf), or a·cos, a·sin of it (--part
//         cos | sin, a the attention factor), as the rotation uses them. --dim is the head dimension
//         (taken from --config when that is given).
#include <cmath>

#include "cli/cli_common.h"

namespace posenc::cli {

namespace {

// The encodings whose table is a function of position alone.
bool has_table(Encoding e) {
  switch (e) {
    case Encoding::kSinusoidal:
    case Encoding::kRope:
      return true;
    default:
      return false;
  }
}

struct TableState {
  std::string enc, length, dim, offset = "0", dtype = "float64", out, part = "angle";
  CLI::Option *dim_opt = nullptr, *part_opt = nullptr;
  ParamFlags params;
};

void run_table(TableState& st) {
  const EncodingInfo& e = st.params.bind(st.enc, "posenc table");
  const std::int64_t L = parse_int("--length", st.length);
  const std::int64_t offset = parse_int("--offset", st.offset);
  const DType dtype = parse_float_dtype("--dtype", st.dtype);
  if (L < 1) fail(Status::Invalid("--length", "expected a positive integer, got " + std::to_string(L)));
  if (offset < 0)
    fail(Status::Invalid("--offset", "expected a position >= 0, got " + std::to_string(offset)));
  if (e.id != Encoding::kRope && st.part_opt->count() > 0)
    fail(Status::Invalid("--part", "only rope's table has parts (angle, cos, sin)"));
  const bool have_dim = st.dim_opt->count() > 0;
  std::int64_t D = have_dim ? parse_int("--dim", st.dim) : 0;

  const FlagMap names = {{"out", "--out"}, {"offset", "--offset"}, {"positions", "--offset"}, {"head_dim", "--dim"}};
  OutputSet outs;
  Tensor table;
  switch (e.id) {
    case Encoding::kSinusoidal:
      if (!have_dim) fail(Status::Invalid("--dim", "is required for sinusoidal: the model dimension D"));
      if (D < 2 || D % 2 != 0)
        fail(Status::Invalid("--dim", "expected a positive even integer, got " + std::to_string(D)));
      check_size("--length", {L, D});
      check(outs.reserve("--out", st.out));
      table = Tensor(dtype, {L, D});
      check_lib(sinusoidal_table(sinusoidal_params(st.params), Positions{View{}, offset}, table.view()), names);
      break;
    case Encoding::kRope: {
      if (st.part != "angle" && st.part != "cos" && st.part != "sin")
        fail(Status::Invalid("--part", "expected angle, cos or sin, got '" + st.part + "'"));
      constexpr std::int64_t kMaxPosition = std::int64_t{1} << 53;  // exact in double
      if (offset > kMaxPosition - L)
        fail(Status::OutOfRange("--offset", "expected offset + length <= 2^53, got " + std::to_string(offset)));
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
      }
      if (D < 2) fail(Status::Invalid("--dim", "expected a head dimension >= 2, got " + std::to_string(D)));
      auto fr = rope_frequencies(p, D, offset + L);
      check_lib(fr.status(), names);
      const RopeFrequencies& f = *fr;
      const std::int64_t half = f.rotary_dim / 2;
      check_size("--length", {L, half});
      table = Tensor(dtype, {L, half});
      const View v = table.view();
      for (std::int64_t l = 0; l < L; ++l)
        for (std::int64_t k = 0; k < half; ++k) {
          const double a = f.angle(offset + l, k);
          const double x = st.part == "angle" ? a : f.attention_factor * (st.part == "cos" ? std::cos(a) : std::sin(a));
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
  add_text(app, "--length", &st->length, "number of positions L", "INT")->required();
  st->dim_opt = add_text(app, "--dim", &st->dim,
                         "model dimension D (even; sinusoidal) or head dimension D (rope; default: from --config)", "INT");
  add_text(app, "--offset", &st->offset, "first position K (default 0)", "INT");
  add_text(app, "--dtype", &st->dtype, "float32 or float64 (default float64)", "float32|float64");
  st->part_opt = add_text(app, "--part", &st->part, "rope: angle (default), cos or sin (times the attention factor)",
                          "angle|cos|sin");
  add_path(app, "--out", &st->out, "output table")->required();
  st->params.declare(app, has_table, /*with_grads=*/false);
  return {app, [st] { run_table(*st); }};
}

}  // namespace posenc::cli
