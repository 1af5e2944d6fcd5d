#include "cli/cli_common.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/param_text.h"

namespace posenc::cli {

// ---- failures ---------------------------------------------------------------------------------

void fail(Status s) { throw Failure{std::move(s)}; }

std::string one_line(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto hex = [&](unsigned char c) {
    char b[8];
    std::snprintf(b, sizeof b, "\\x%02X", c);
    out += b;
  };
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n' || c == '\r' || c == '\t') {
      if (!out.empty() && out.back() != ' ') out.push_back(' ');
    } else if (c < 0x20 || c == 0x7f) {
      hex(c);  // other control bytes (an input's bytes quoted in a message) are shown, not sent
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {  // UTF-8 passes whole ("×"); a byte outside a well-formed sequence is shown as \xNN
      const std::size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
      bool whole = n > 0 && i + n <= s.size();
      for (std::size_t k = 1; whole && k < n; ++k) whole = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
      if (!whole) {
        hex(c);
        continue;
      }
      out.append(s, i, n);
      i += n - 1;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::string flag_for(const std::string& arg, const FlagMap& extra) {
  if (arg.empty() || arg == "ENC" || arg.rfind("--", 0) == 0) return arg;
  for (const auto& [name, flag] : extra)
    if (name == arg) return flag;
  static const FlagMap shared = {
      {"x", "--in"},
      {"y", "--out"},
      {"out", "--out"},
      {"dy", "--grad-out"},
      {"dout", "--grad-out"},
      {"dbias", "--grad-out"},
      {"dx", "--grad-in"},
      {"positions", "--positions"},
      {"pos", "--positions"},
      {"ids", "--positions"},
      {"dq", "--grad-q"},
      {"dk", "--grad-k"},
      {"dv", "--grad-v"},
      {"dweights", "--grad-weights"},
      {"dtable", "--grad-table"},
      {"du", "--grad-u"},
      {"dv_bias", "--grad-v-bias"},
      {"drel_proj", "--grad-rel-proj"},
      {"dr1", "--grad-r1"},
      {"dr2", "--grad-r2"},
      {"dmlp_w1", "--grad-mlp-w1"},
      {"dmlp_b1", "--grad-mlp-b1"},
      {"dmlp_w2", "--grad-mlp-w2"},
      {"dmlp_b2", "--grad-mlp-b2"},
      {"dc", "--grad-c"},
      {"dthreshold", "--grad-threshold"},
      {"dfreqs", "--grad-freqs"},
      {"lse", "--lse"},
      {"encoding", "ENC"},
  };
  for (const auto& [name, flag] : shared)
    if (name == arg) return flag;
  // "rope.rotary_dim" or "p.rotary_dim": the last component names the parameter.
  std::string a = arg.substr(arg.find_last_of('.') == std::string::npos ? 0 : arg.find_last_of('.') + 1);
  std::replace(a.begin(), a.end(), '_', '-');
  return "--" + a;
}

namespace {

// The library's "expected an absent view" (a tensor this configuration does not read) in a command
// line's words.
std::string cli_words(std::string what) {
  static const std::string kAbsent = "expected an absent view";
  if (const std::size_t at = what.find(kAbsent); at != std::string::npos)
    what.replace(at, kAbsent.size(), "leave that flag out");
  return what;
}

// require_same_dtype's "expected float64 like r1, got float32" names a second library argument in its
// text: rename it too ("like --r1").
std::string rename_like(const std::string& what_in, const FlagMap& extra) {
  static const std::string kLike = " like ";
  const std::string what = cli_words(what_in);
  const std::size_t at = what.find(kLike);
  if (at == std::string::npos) return what;
  const std::size_t start = at + kLike.size();
  std::size_t end = start;
  while (end < what.size() && (std::islower(static_cast<unsigned char>(what[end])) ||
                               std::isdigit(static_cast<unsigned char>(what[end])) || what[end] == '_'))
    ++end;
  if (end == start || (end < what.size() && what[end] != ',' && what[end] != ' ')) return what;
  return what.substr(0, start) + flag_for(what.substr(start, end - start), extra) + what.substr(end);
}

}  // namespace

void check_lib(const Status& s, const FlagMap& extra) {
  if (s.ok()) return;
  switch (s.code()) {
    case Code::kInvalidArgument:
      fail(Status::Invalid(flag_for(s.arg(), extra), rename_like(s.what(), extra)));
    case Code::kOutOfRange:
      fail(Status::OutOfRange(flag_for(s.arg(), extra), rename_like(s.what(), extra)));
    case Code::kIo:
      fail(Status::Io(flag_for(s.arg(), extra), cli_words(s.what())));
    case Code::kInternal:
    case Code::kOk:
      break;
  }
  fail(s);
}

// ---- values -----------------------------------------------------------------------------------

// The value rules are the library's (core/param_text.h), shared with the C ABI's keys.
std::int64_t parse_int(const std::string& flag, const std::string& text) {
  return take(posenc::text::parse_int(flag, text));
}

double parse_float(const std::string& flag, const std::string& text) {
  return take(posenc::text::parse_float(flag, text));
}

bool parse_bool(const std::string& flag, const std::string& text) {
  return take(posenc::text::parse_bool(flag, text));
}

DType parse_float_dtype(const std::string& flag, const std::string& text) {
  if (text == "float32" || text == "f4" || text == "<f4") return DType::kF32;
  if (text == "float64" || text == "f8" || text == "<f8") return DType::kF64;
  fail(Status::Invalid(flag, "expected float32 or float64, got '" + text + "'"));
}

CLI::Option* add_text(CLI::App* app, const std::string& flag, std::string* dest, const std::string& help,
                      const std::string& type_name) {
  return app->add_option(flag, *dest, help)->type_name(type_name);
}

CLI::Option* add_path(CLI::App* app, const std::string& flag, std::string* dest, const std::string& help) {
  return app->add_option(flag, *dest, help)->type_name("FILE.npy");
}

Tensor read_input(const std::string& flag, const std::string& path) { return take(read_npy(path, flag)); }

void require_float_tensor(const std::string& flag, const Tensor& t) {
  if (!is_float(t.dtype()))
    fail(
        Status::Invalid(flag, std::string("expected float32, float64 or float16 data, got ") + dtype_name(t.dtype())));
}

namespace {

constexpr std::int64_t kMaxValues = std::int64_t{1} << 34;  // 128 GiB of float64: surely a typo

// "--heads × --q-len × --k-len = 100000000000 × 3 × 4 = 1.2e+12 values", and the largest factor.
std::string product_text(const std::vector<SizeFactor>& factors, const SizeFactor** largest) {
  std::string names, values;
  double n = 1;
  *largest = nullptr;
  for (const SizeFactor& f : factors) {
    names += (names.empty() ? "" : " × ") + (f.label.empty() ? f.flag : f.label);
    values += (values.empty() ? "" : " × ") + std::to_string(f.value);
    n *= static_cast<double>(f.value);
    if (*largest == nullptr || f.value > (*largest)->value) *largest = &f;
  }
  char total[32];
  std::snprintf(total, sizeof total, "%.3g", n);
  return factors.size() == 1 ? names + " = " + values + " values"
                             : names + " = " + values + " = " + total + " values";
}

}  // namespace

void check_product(const std::vector<SizeFactor>& factors) {
  std::int64_t n = 1;
  bool over = false;
  for (const SizeFactor& f : factors) {
    if (f.value < 1) fail(Status::Internal("check_product: factor " + f.flag + " < 1"));
    if (n > kMaxValues / f.value) over = true;
    else n *= f.value;
  }
  if (!over) return;
  const SizeFactor* largest = nullptr;
  const std::string text = product_text(factors, &largest);
  fail(Status::OutOfRange(largest->flag, "the result would be too large: " + text +
                                             ", more than the 2^34 (17179869184) a result may hold"));
}

void fail_memory(const std::vector<SizeFactor>& factors) {
  const SizeFactor* largest = nullptr;
  const std::string text = product_text(factors, &largest);
  fail(Status::OutOfRange(largest ? largest->flag : std::string("--out"),
                          "not enough memory for the result: " + text));
}

// ---- registry parameters as flags -------------------------------------------------------------

namespace {

std::string type_name_of(const ParamSpec& p) {
  if (p.type == "float") return "FLOAT";
  if (p.type == "int") return "INT";
  if (p.type == "ints") return "INT,INT,...";
  if (p.type == "bool") return "true|false";
  if (p.type == "tensor") return "FILE.npy";
  if (p.type == "file") return "FILE";
  if (p.type == "choice") {
    std::string s;
    for (const std::string& c : p.choices) s += (s.empty() ? "" : "|") + c;
    return s;
  }
  return "VALUE";
}

std::string help_of(const ParamSpec& p) {
  std::string h = p.help;
  if (!p.default_.empty()) h += " (default " + p.default_ + ")";
  return h;
}

std::string join_flags(const std::vector<ParamSpec>& ps) {
  std::string s;
  for (const ParamSpec& p : ps) s += (s.empty() ? "--" : ", --") + p.name;
  return s;
}

}  // namespace

void ParamFlags::declare(CLI::App* app, Accept accept, bool with_grads) {
  accept_ = std::move(accept);
  for (const EncodingInfo& e : registry()) {
    if (!accept_(e.id)) continue;
    for (const ParamSpec& p : e.params) {
      Slot* s = nullptr;
      for (auto& existing : slots_)
        if (existing->name == p.name) s = existing.get();
      if (s == nullptr) {
        slots_.push_back(std::make_unique<Slot>());
        s = slots_.back().get();
        s->name = p.name;
        s->spec = p;
      }
      s->owners.push_back(e.name);
    }
  }
  for (auto& s : slots_) {
    // One declaration per flag; a shared name says which encoding reads it how.
    std::string help, group;
    for (const std::string& owner : s->owners) {
      const EncodingInfo& e = take(find_encoding(owner));
      for (const ParamSpec& p : e.params)
        if (p.name == s->name)
          help += (help.empty() ? "" : "; ") + (s->owners.size() > 1 ? "[" + owner + "] " : std::string()) +
                  help_of(p);
      group += (group.empty() ? "" : ", ") + owner;
    }
    // A choice shared by several encodings lists every encoding's values.
    ParamSpec shown = s->spec;
    for (const std::string& owner : s->owners)
      for (const ParamSpec& p : take(find_encoding(owner)).params)
        if (p.name == s->name)
          for (const std::string& c : p.choices)
            if (std::find(shown.choices.begin(), shown.choices.end(), c) == shown.choices.end())
              shown.choices.push_back(c);
    s->opt =
        add_text(app, "--" + s->name, &s->value, help, type_name_of(shown))->group(group + " parameters");
    if (with_grads && s->spec.learned) {
      s->grad_opt = add_path(app, "--grad-" + s->name, &s->grad_path,
                             "output: gradient of the loss with respect to --" + s->name)
                        ->group(group + " parameters");
    }
  }
}

const EncodingInfo& ParamFlags::bind(const std::string& enc_name, const std::string& command) {
  const EncodingInfo& e = encoding_info(take(find_encoding(enc_name)).id);
  if (!accept_(e.id)) {
    fail(Status::Invalid("ENC", command + " does not take '" + e.name + "' (kind " + kind_name(e.kind) +
                                    "); it takes: " + encoding_names(accept_)));
  }
  enc_ = &e;
  for (const auto& s : slots_) {
    const bool mine = has(s->name);
    if (s->opt->count() > 0 && !mine) {
      std::string owners;
      for (const std::string& o : s->owners) owners += (owners.empty() ? "" : " and ") + o;
      fail(Status::Invalid("--" + s->name,
                           "is a parameter of " + owners + ", not of " + e.name + " (" + e.name + " takes " +
                               (e.params.empty() ? "no parameters" : join_flags(e.params)) + ")"));
    }
    if (s->grad_opt != nullptr && s->grad_opt->count() > 0) {
      bool learned = false;
      for (const ParamSpec& p : e.params)
        if (p.name == s->name && p.learned) learned = true;
      if (!learned) fail(Status::Invalid("--grad-" + s->name, e.name + " has no learned --" + s->name));
    }
  }
  return e;
}

const ParamFlags::Slot* ParamFlags::slot(const std::string& name) const {
  for (const auto& s : slots_)
    if (s->name == name) return s.get();
  return nullptr;
}

bool ParamFlags::has(const std::string& name) const {
  if (enc_ == nullptr) return false;
  for (const ParamSpec& p : enc_->params)
    if (p.name == name) return true;
  return false;
}

bool ParamFlags::given(const std::string& name) const {
  const Slot* s = slot(name);
  return has(name) && s != nullptr && s->opt->count() > 0;
}

const ParamSpec& ParamFlags::spec(const std::string& name) const {
  if (enc_ != nullptr)
    for (const ParamSpec& p : enc_->params)
      if (p.name == name) return p;
  fail(Status::Internal("the CLI asked for parameter '" + name + "', which " +
                        (enc_ ? enc_->name : std::string("no encoding")) + " does not declare"));
}

std::string ParamFlags::text(const std::string& name) const {
  const ParamSpec& p = spec(name);
  return given(name) ? slot(name)->value : p.default_;
}

std::string ParamFlags::text_of(const std::string& name) const { return text(name); }

double ParamFlags::f64(const std::string& name) const { return parse_float("--" + name, text(name)); }

std::int64_t ParamFlags::i64(const std::string& name) const { return parse_int("--" + name, text(name)); }

bool ParamFlags::boolean(const std::string& name) const { return parse_bool("--" + name, text(name)); }

std::string ParamFlags::choice(const std::string& name) const {
  const ParamSpec& p = spec(name);
  const std::string v = text(name);
  if (std::find(p.choices.begin(), p.choices.end(), v) == p.choices.end()) {
    std::string want;
    for (std::size_t i = 0; i < p.choices.size(); ++i)
      want += (i == 0 ? "" : (i + 1 == p.choices.size() ? " or " : ", ")) + p.choices[i];
    fail(Status::Invalid("--" + name, "expected " + want + ", got '" + v + "'"));
  }
  return v;
}

void ParamFlags::load_tensors() {
  for (const ParamSpec& p : enc().params) {
    if (p.type != "tensor" || !given(p.name)) continue;
    Tensor t = read_input("--" + p.name, slot(p.name)->value);
    require_float_tensor("--" + p.name, t);
    tensors_[p.name] = std::move(t);
  }
}

const Tensor* ParamFlags::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

View ParamFlags::view(const std::string& name) const {
  const Tensor* t = tensor(name);
  return t ? t->view() : View{};
}

std::vector<std::string> ParamFlags::grad_flags_given() const {
  std::vector<std::string> out;
  for (const auto& s : slots_)
    if (s->grad_opt != nullptr && s->grad_opt->count() > 0) out.push_back("--grad-" + s->name);
  return out;
}

void ParamFlags::reserve_grads(OutputSet* outs) const {
  for (const auto& s : slots_)
    if (s->grad_opt != nullptr && s->grad_opt->count() > 0)
      check(outs->reserve("--grad-" + s->name, s->grad_path));
}

void ParamFlags::alloc_grads() {
  for (const auto& s : slots_) {
    if (s->grad_opt == nullptr || s->grad_opt->count() == 0) continue;
    const Tensor* p = tensor(s->name);
    if (p == nullptr)
      fail(Status::Invalid("--grad-" + s->name, "needs --" + s->name + " (the gradient has its shape)"));
    grads_[s->name] = Tensor(p->dtype(), p->shape());
  }
}

View ParamFlags::grad_view(const std::string& name) const {
  const auto it = grads_.find(name);
  return it == grads_.end() ? View{} : it->second.view();
}

void ParamFlags::attach_grads(OutputSet* outs) const {
  for (const auto& [name, t] : grads_) outs->attach("--grad-" + name, &t);
}

std::string encoding_names(const ParamFlags::Accept& accept) {
  std::string s;
  for (const EncodingInfo& e : registry())
    if (accept(e.id)) s += (s.empty() ? "" : ", ") + e.name;
  return s;
}

// ---- the catalogue ----------------------------------------------------------------------------

void print_catalogue() {
  std::vector<std::vector<std::string>> rows = {{"NAME", "KIND", "PARAMETERS", "SUMMARY"}};
  for (const EncodingInfo& e : registry()) {
    // A long parameter list (rope's) is abbreviated: posenc list --json and --help have them all.
    std::string flags = join_flags(e.params);
    if (e.params.size() > 5)
      flags = join_flags({e.params.begin(), e.params.begin() + 3}) + ", ... (" + std::to_string(e.params.size()) +
              " flags)";
    rows.push_back({e.name, kind_name(e.kind), flags, e.summary});
  }
  std::vector<std::size_t> width(4, 0);
  for (const auto& r : rows)
    for (std::size_t c = 0; c < 3; ++c) width[c] = std::max(width[c], r[c].size());
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t c = 0; c < 4; ++c) {
      line += r[c];
      if (c < 3) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

Corpus corpus_or_fail(const std::string& path) {
  if (!path.empty()) note_input(path, "--corpus");
  Expected<Corpus> c = load_corpus(path);
  if (!c.ok()) check_lib(c.status());
  return std::move(c).value();
}

void check_study(const Status& s) {
  if (s.ok()) return;
  switch (s.code()) {
    case Code::kInvalidArgument:
      fail(Status::Invalid(flag_for(s.arg()), s.what()));
    case Code::kOutOfRange:
      fail(Status::OutOfRange(flag_for(s.arg()), s.what()));
    case Code::kIo:
      fail(Status::Io(flag_for(s.arg()), s.what()));
    case Code::kInternal:
    case Code::kOk:
      break;
  }
  fail(s);
}

void require_feature_dim(const std::string& flag, const Tensor& t) {
  if (!t.shape().empty() && t.shape().back() > (std::int64_t{1} << 20))
    fail(Status::OutOfRange(flag, "expected a last dimension D <= 2^20 (1048576), got shape " + t.shape_str()));
}

}  // namespace posenc::cli
