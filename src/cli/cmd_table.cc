// posenc table ENC --length L --dim D [--offset K] [params] [--dtype float32|float64] --out T.npy
// The fixed table of an absolute encoding, rows for positions K .. K+L−1 (sinusoidal: [L, D]).
#include "cli/cli_common.h"

namespace posenc::cli {

namespace {

// The encodings whose table is a function of position alone.
bool has_table(Encoding e) {
  switch (e) {
    case Encoding::kSinusoidal:
      return true;
    default:
      return false;
  }
}

struct TableState {
  std::string enc, length, dim, offset = "0", dtype = "float64", out;
  ParamFlags params;
};

void run_table(TableState& st) {
  const EncodingInfo& e = st.params.bind(st.enc, "posenc table");
  const std::int64_t L = parse_int("--length", st.length);
  const std::int64_t D = parse_int("--dim", st.dim);
  const std::int64_t offset = parse_int("--offset", st.offset);
  const DType dtype = parse_float_dtype("--dtype", st.dtype);
  if (L < 1) fail(Status::Invalid("--length", "expected a positive integer, got " + std::to_string(L)));
  if (D < 2 || D % 2 != 0)
    fail(Status::Invalid("--dim", "expected a positive even integer, got " + std::to_string(D)));
  if (offset < 0)
    fail(Status::Invalid("--offset", "expected a position >= 0, got " + std::to_string(offset)));
  check_size("--length", {L, D});

  OutputSet outs;
  check(outs.reserve("--out", st.out));

  Tensor table(dtype, {L, D});
  const FlagMap names = {{"out", "--out"}, {"offset", "--offset"}, {"positions", "--offset"}};
  switch (e.id) {
    case Encoding::kSinusoidal:
      check_lib(sinusoidal_table(sinusoidal_params(st.params), Positions{View{}, offset}, table.view()),
                names);
      break;
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
      "table", "write an absolute encoding's table [L, D] (" + encoding_names(has_table) + ")");
  app->allow_extras();
  app->add_option("ENC", st->enc, "the encoding: " + encoding_names(has_table))->required();
  add_text(app, "--length", &st->length, "number of positions L", "INT")->required();
  add_text(app, "--dim", &st->dim, "model dimension D (even)", "INT")->required();
  add_text(app, "--offset", &st->offset, "first position K (default 0)", "INT");
  add_text(app, "--dtype", &st->dtype, "float32 or float64 (default float64)", "float32|float64");
  add_path(app, "--out", &st->out, "output table [L, D]")->required();
  st->params.declare(app, has_table, /*with_grads=*/false);
  return {app, [st] { run_table(*st); }};
}

}  // namespace posenc::cli
