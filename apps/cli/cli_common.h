// cli/cli_common.h — what the subcommands share: one-line failures, library argument names turned
// into flags, typed values, and the registry's parameters declared as flags (once each, from their
// ParamSpec: name, type, default, choices, help).
//
// Inside a command, errors are thrown as Failure and main() prints them as the one line
// "posenc: <flag>: <what was expected>"; the library itself returns Status values (see status.h).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/npy.h"
#include "cli/output_set.h"
#include "posenc/posenc.h"
#include "study/study.h"

namespace posenc::cli {

// ---- failures ---------------------------------------------------------------------------------
struct Failure {
  Status status;  // arg is already a flag ("--rotary-dim") or "ENC"
};
[[noreturn]] void fail(Status s);
inline void check(const Status& s) {
  if (!s.ok()) fail(s);
}
template <class T>
T take(Expected<T> e) {
  if (!e.ok()) fail(e.status());
  return std::move(e).value();
}

// Library argument name → flag. `extra` holds a command's own names (checked first); then the shared
// ones ("x" → "--in", "out"/"y" → "--out", "dy"/"dout"/"dbias" → "--grad-out", "positions" →
// "--positions", "dq" → "--grad-q", ...); anything else becomes "--" + arg with '_' → '-'
// ("rotary_dim" → "--rotary-dim", "v_bias" → "--v-bias").
using FlagMap = std::vector<std::pair<std::string, std::string>>;
std::string flag_for(const std::string& arg, const FlagMap& extra = {});
// Throws a failing library Status with its argument renamed to the flag (and the argument a dtype
// message compares it with, "expected float64 like r1", renamed the same way).
void check_lib(const Status& s, const FlagMap& extra = {});
// The value, or check_lib's failure.
template <class T>
T take_lib(Expected<T> e, const FlagMap& extra = {}) {
  if (!e.ok()) check_lib(e.status(), extra);
  return std::move(e).value();
}

// The study's corpus (posenc/study.h's load_corpus), or a failure naming --corpus.
Corpus corpus_or_fail(const std::string& path);
// A failing study Status (study/run.h, study/results.h) with its argument turned into the flag
// ("out" → "--out"); the text is kept as it is (it quotes paths).
void check_study(const Status& s);
template <class T>
T take_study(Expected<T> e) {
  if (!e.ok()) check_study(e.status());
  return std::move(e).value();
}

// The single line main() prints for a failure (no newlines inside).
std::string one_line(const std::string& s);

// ---- values -----------------------------------------------------------------------------------
std::int64_t parse_int(const std::string& flag, const std::string& text);
double parse_float(const std::string& flag, const std::string& text);       // finite
bool parse_bool(const std::string& flag, const std::string& text);          // true/false (1/0, yes/no)
DType parse_float_dtype(const std::string& flag, const std::string& text);  // float32 | float64

// A value-taking option stored as text and typed later (so every bad value gets our one-line error).
CLI::Option* add_text(CLI::App* app, const std::string& flag, std::string* dest, const std::string& help,
                      const std::string& type_name);
// An .npy path option.
CLI::Option* add_path(CLI::App* app, const std::string& flag, std::string* dest, const std::string& help);

// Reads an input .npy file (a Failure names the flag).
Tensor read_input(const std::string& flag, const std::string& path);
// Requires a float tensor (data inputs: q, k, v, x, tables, gradients).
void require_float_tensor(const std::string& flag, const Tensor& t);
// Requires the last dimension (a head or model dimension D) within 2^20, as table's --dim: an
// empty tensor can still declare D = 2^30, which per-dimension tables would then allocate.
void require_feature_dim(const std::string& flag, const Tensor& t);
// One factor of a result's size: the flag the user set it with, its value, and how it enters the
// product when that is not the flag itself ("--dim/2").
struct SizeFactor {
  std::string flag;
  std::int64_t value = 0;
  std::string label = {};  // default: flag
};
// Refuses a result of more than 2^34 values (128 GiB of float64: surely a typo) before anything is
// allocated. The failure names the flag of the largest factor, the one out of range, and shows the
// product: "--heads: --heads × --q-len × --k-len = 100000000000 × 3 × 4 = 1.2e+12 values, more than
// the 2^34 ...". Every factor must be >= 1 (checked before).
void check_product(const std::vector<SizeFactor>& factors);
// The same failure for a result within that bound that this machine cannot allocate.
[[noreturn]] void fail_memory(const std::vector<SizeFactor>& factors);
// Runs fn(); an allocation failing inside it is fail_memory(factors) (exit 2, naming the flag).
template <class F>
decltype(auto) within_memory(const std::vector<SizeFactor>& factors, F&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    fail_memory(factors);
  }
}

// ---- the registry's parameters as flags -------------------------------------------------------
class ParamFlags {
 public:
  using Accept = std::function<bool(Encoding)>;

  // Declares --<name> once for every parameter of the encodings `accept` admits (the ParamSpec gives
  // the help, type, default and choices; a name shared by several encodings is declared once, its
  // help joined), and, when `with_grads`, --grad-<name> for each learned one.
  void declare(CLI::App* app, Accept accept, bool with_grads);

  // After parsing: ENC from the registry; an encoding the command does not take, or a parameter flag
  // of another encoding, is a Failure naming it.
  const EncodingInfo& bind(const std::string& enc_name, const std::string& command);
  const EncodingInfo& enc() const { return *enc_; }

  bool has(const std::string& name) const;    // a parameter of the bound encoding
  bool given(const std::string& name) const;  // its flag appeared on the command line
  double f64(const std::string& name) const;
  std::int64_t i64(const std::string& name) const;
  bool boolean(const std::string& name) const;
  std::string choice(const std::string& name) const;
  std::string text_of(const std::string& name) const;  // the given value or the default, as text

  // Tensor parameters of the bound encoding: reads every given file (float data only).
  void load_tensors();
  const Tensor* tensor(const std::string& name) const;  // null when absent
  View view(const std::string& name) const;             // absent view when absent

  // Gradient outputs --grad-<name>: which were given, and zero tensors shaped like their parameter
  // (a gradient asked for a parameter that was not given is a Failure).
  std::vector<std::string> grad_flags_given() const;  // "--grad-weights", ...
  void reserve_grads(OutputSet* outs) const;
  void alloc_grads();
  View grad_view(const std::string& name) const;  // absent view unless asked for
  void attach_grads(OutputSet* outs) const;

 private:
  struct Slot {
    std::string name;
    ParamSpec spec;                   // the first declaration (types agree across encodings)
    std::vector<std::string> owners;  // encodings that take it
    std::string value;
    CLI::Option* opt = nullptr;
    std::string grad_path;
    CLI::Option* grad_opt = nullptr;
  };
  const Slot* slot(const std::string& name) const;
  const ParamSpec& spec(const std::string& name) const;
  std::string text(const std::string& name) const;  // given value or the default

  Accept accept_;
  std::vector<std::unique_ptr<Slot>> slots_;
  const EncodingInfo* enc_ = nullptr;
  std::map<std::string, Tensor> tensors_, grads_;
};

// The registry's names of the encodings `accept` admits, in catalogue order: "nope, rope, alibi".
std::string encoding_names(const ParamFlags::Accept& accept);

// ---- per-encoding glue: ParamSpec names → fields of the library's params structs ----------------
// RoPE's flags (after load_tensors: the lists come from .npy files). With --config the config.json
// sets the parameters (the flags it sets are then errors), *config_head_dim gets its head dimension
// (0 without --config) for the command to check its tensors against.
RopeParams rope_params(const ParamFlags& f, std::int64_t* config_head_dim = nullptr);
// The flags behind the library's names for RoPE's parameters where they are not RoPE's own flags:
// with --config, every parameter the config sets ("theta", "factor", ...) is --config's; without it,
// an unset --rotary-dim means the whole head dimension, so "rotary_dim" is `dim_flag` (the flag that
// gave D: "--dim", "--in", "--q").
FlagMap rope_names(const ParamFlags& f, const std::string& dim_flag);
// Reads a Hugging Face config.json (failures name `flag`, then the config field).
RopeModelConfig read_rope_config(const std::string& flag, const std::string& path);
// rope2d: --variant, --layout, --rotary-dim, --theta (default 100 axial, 10 mixed).
Rope2dParams rope2d_params(const ParamFlags& f);
// mrope: --variant, --mrope-section (required) and RoPE's flags (rope_params, after load_tensors); or
// --config, an M-RoPE model's config.json, for both (--mrope-section beside it is refused); its
// head dimension into *config_head_dim when asked (0 without --config).
MropeParams mrope_params(const ParamFlags& f, std::int64_t* config_head_dim = nullptr);
// xpos: --scale-base, --gamma, --center and RoPE's flags (rope_params, after load_tensors).
XposParams xpos_params(const ParamFlags& f);
// "16,24,24" → {16, 24, 24} (a Failure names the flag).
std::vector<std::int64_t> parse_ints(const std::string& flag, const std::string& text);
// Reads an int32/int64 positions tensor (a Failure names the flag; shapes are the library's to check).
Tensor read_positions(const std::string& flag, const std::string& path);
AlibiParams alibi_params(const ParamFlags& f);
T5Params t5_params(const ParamFlags& f);
SinusoidalParams sinusoidal_params(const ParamFlags& f);
KerpleParams kerple_params(const ParamFlags& f);
SandwichParams sandwich_params(const ParamFlags& f);
EncodingTensors encoding_tensors(const ParamFlags& f);  // the bound encoding's tensors given (others absent)
EncodingGrads encoding_grads(const ParamFlags& f);      // their --grad-* outputs asked for (others absent)

// ---- subcommands ------------------------------------------------------------------------------
struct Command {
  CLI::App* app = nullptr;
  std::function<void()> run;  // throws Failure
};

Command add_list_command(CLI::App& root);
Command add_table_command(CLI::App& root);
Command add_apply_command(CLI::App& root);
Command add_bias_command(CLI::App& root);
Command add_attention_command(CLI::App& root);
Command add_tour_command(CLI::App& root);
Command add_bench_command(CLI::App& root);
Command add_study_command(CLI::App& root);
Command add_train_command(CLI::App& root);
Command add_plot_command(CLI::App& root);
Command add_check_command(CLI::App& root);
Command add_rope_config_command(CLI::App& root);
Command add_mrope_positions_command(CLI::App& root);

// Prints the catalogue as an aligned table (list and tour share it).
void print_catalogue();

}  // namespace posenc::cli
