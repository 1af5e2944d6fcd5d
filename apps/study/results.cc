// study/results.cc — results as JSON, CSV and a table, and results.json read back.
#include "study/results.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "posenc/registry.h"
#include "study/json_int.h"

namespace posenc {
namespace {

using json = nlohmann::json;

json optional_json(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

// printf into a string.
[[gnu::format(printf, 1, 2)]] std::string format(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return {};
  if (std::size_t(n) < sizeof buf) return std::string(buf, std::size_t(n));
  std::string big(std::size_t(n) + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(big.data(), big.size(), fmt, ap);
  va_end(ap);
  big.resize(std::size_t(n));
  return big;
}

// A value with three decimals, "-" when missing.
std::string three(const std::optional<double>& v) { return v ? format("%.3f", *v) : std::string("-"); }

// s right-aligned in w columns, counting characters, not bytes ("±" is two bytes of UTF-8).
std::string right(const std::string& s, std::size_t w) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return std::string(n < w ? w - n : 0, ' ') + s;
}

}  // namespace

std::string result_to_json(const StudyResult& r) {
  json j = {{"name", r.name},
            {"encoding", int(r.encoding)},
            {"seed", r.seeds.empty() ? 0 : r.seeds.front()},
            {"final_train_loss", r.final_train_loss},
            {"train_seconds", r.train_seconds},
            {"tokens_per_second", r.tokens_per_second}};
  j["eval"] = json::array();
  for (const EvalPoint& p : r.eval) {
    json pt = {{"len", p.len}, {"ppl", optional_json(p.ppl)}, {"acc", optional_json(p.acc)}};
    if (p.depth) pt["depth"] = *p.depth;
    j["eval"].push_back(pt);
  }
  return j.dump();
}

Expected<StudyResult> result_from_json(const std::string& line) {
  const json j = json::parse(line, nullptr, false);
  if (j.is_discarded()) return Status::Invalid("result", "expected a result as JSON, got malformed text");
  try {
    StudyResult r;
    r.name = j.at("name").get<std::string>();
    const std::int64_t enc = json_int(j.at("encoding"));
    if (enc < 0 || enc >= std::int64_t(registry().size()))
      return Status::Invalid("result", "expected an encoding's number in [0, " + std::to_string(registry().size()) +
                                           "), got " + std::to_string(enc));
    r.encoding = Encoding(enc);
    r.seeds = {json_uint(j.at("seed"))};
    r.final_train_loss = j.at("final_train_loss").get<double>();
    r.train_seconds = j.at("train_seconds").get<double>();
    r.tokens_per_second = j.at("tokens_per_second").get<double>();
    for (const json& p : j.at("eval")) {
      EvalPoint pt;
      pt.len = json_int(p.at("len"));
      if (!p.at("ppl").is_null()) pt.ppl = p.at("ppl").get<double>();
      if (!p.at("acc").is_null()) pt.acc = p.at("acc").get<double>();
      if (p.contains("depth")) pt.depth = p.at("depth").get<double>();
      r.eval.push_back(pt);
    }
    return r;
  } catch (const json::exception& e) {
    return Status::Invalid("result", std::string("expected a study result, got JSON without its fields (") +
                                         e.what() + ")");
  }
}

std::string results_json(const StudyRun& run) {
  const StudyConfig& cfg = run.cfg;
  const bool acc = cfg.task.has_value();
  json j;
  j["train_len"] = cfg.train_len;
  if (acc) j["task"] = task_name(*cfg.task);
  j["corpus"] = run.corpus;
  j["preset"] = run.preset;
  j["steps"] = cfg.steps;
  j["batch"] = cfg.batch;
  j["seed"] = cfg.seed;
  j["seeds"] = cfg.seeds;
  j["eval_tokens"] = cfg.eval_tokens;
  j["model"] = {{"d_model", cfg.model.d_model}, {"n_layers", cfg.model.n_layers},
                {"n_heads", cfg.model.n_heads}, {"d_ff", cfg.model.d_ff}};
  j["encodings"] = json::array();
  for (const StudyResult& r : run.results) {
    json e = {{"encoding", r.name}, {"seeds", r.seeds}, {"final_train_loss", r.final_train_loss}};
    e["eval"] = json::array();
    const bool spread = r.per_seed.size() > 1;
    for (std::size_t i = 0; i < r.eval.size(); ++i) {
      const EvalPoint& p = r.eval[i];
      json pt = {{"len", p.len}};
      if (p.depth) pt["depth"] = *p.depth;
      pt["ppl"] = optional_json(p.ppl);
      if (spread) pt["ppl_sd"] = optional_json(p.ppl_sd);
      if (acc) pt["acc"] = optional_json(p.acc);
      if (acc && spread) pt["acc_sd"] = optional_json(p.acc_sd);
      if (spread) {  // every seed's value, in the order of "seeds"
        pt["ppl_seeds"] = json::array();
        if (acc) pt["acc_seeds"] = json::array();
        for (const std::vector<EvalPoint>& s : r.per_seed) {
          pt["ppl_seeds"].push_back(i < s.size() ? optional_json(s[i].ppl) : json(nullptr));
          if (acc) pt["acc_seeds"].push_back(i < s.size() ? optional_json(s[i].acc) : json(nullptr));
        }
      }
      e["eval"].push_back(pt);
    }
    j["encodings"].push_back(e);
  }
  return j.dump(2) + "\n";
}

std::string results_csv(const StudyRun& run) {
  const bool acc = run.cfg.task.has_value(), sd = run.cfg.seeds > 1;
  const bool depth = acc && *run.cfg.task == Task::kPasskey;
  std::string csv = std::string("encoding,len") + (depth ? ",depth" : "") + ",ppl" + (sd ? ",ppl_sd" : "") +
                    (acc ? ",acc" : "") + (acc && sd ? ",acc_sd" : "") + "\n";
  const auto field = [](const std::optional<double>& v) { return v ? three(v) : std::string(); };
  for (const StudyResult& r : run.results)
    for (const EvalPoint& p : r.eval)
      csv += r.name + "," + std::to_string(p.len) + (depth ? "," + (p.depth ? format("%g", *p.depth) : "") : "") +
             "," + field(p.ppl) + (sd ? "," + field(p.ppl_sd) : "") + (acc ? "," + field(p.acc) : "") +
             (acc && sd ? "," + field(p.acc_sd) : "") + "\n";
  return csv;
}

namespace {

// One table row: the name, then per point its accuracy (perplexity without a task), mean ± sd with
// two seeds or more, the last over the first and `extra` (tokens per second, or nothing).
std::string table_row(const StudyRun& run, const std::string& name, std::size_t name_w,
                      const std::vector<const EvalPoint*>& pts, const std::string& extra) {
  const bool acc = run.cfg.task.has_value(), sd = run.cfg.seeds > 1;
  const std::size_t w = sd ? 13 : 9;  // "12.345±0.678"
  std::string t = format("%-*s", int(name_w), name.c_str());
  for (const EvalPoint* p : pts) {
    const auto& v = acc ? p->acc : p->ppl;
    const auto& s = acc ? p->acc_sd : p->ppl_sd;
    t += " " + right(v && s ? three(v) + "±" + three(s) : three(v), w);
  }
  if (pts.empty()) return t + format(" %9s", "-") + extra + "\n";
  const auto& a = acc ? pts.front()->acc : pts.front()->ppl;
  const auto& b = acc ? pts.back()->acc : pts.back()->ppl;
  return t + format(" %9s", a && b ? three(*b / *a).c_str() : "-") + extra + "\n";
}

// The points of r at `depth` (absent: the random placement, or the corpus), in length order.
std::vector<const EvalPoint*> points_at(const StudyResult& r, std::optional<double> depth) {
  std::vector<const EvalPoint*> out;
  for (const EvalPoint& p : r.eval)
    if (p.depth == depth) out.push_back(&p);
  return out;
}

}  // namespace

std::string results_table(const StudyRun& run) {
  const StudyConfig& cfg = run.cfg;
  const bool acc = cfg.task.has_value(), sd = cfg.seeds > 1;
  const int w = sd ? 13 : 9;  // "12.345±0.678"
  std::string seeds = sd ? format(", mean ± sd over %lld seeds", (long long)cfg.seeds) : std::string();
  std::string t =
      acc ? format("accuracy on %lld fresh examples per length (%s), trained at length %lld%s\n",
                   (long long)cfg.eval_examples, run.corpus.c_str(), (long long)cfg.train_len, seeds.c_str())
          : format("perplexity per byte on %lld held-out bytes (%s), trained at length %lld%s\n",
                   (long long)cfg.eval_tokens, run.corpus.c_str(), (long long)cfg.train_len, seeds.c_str());
  std::size_t name_w = 11;
  for (const StudyResult& r : run.results) name_w = std::max(name_w, r.name.size() + 1);
  std::string lengths;
  for (std::int64_t m : cfg.eval_multiples) lengths += format(" %*lld", w, (long long)(m * cfg.train_len));
  t += format("%-*s", int(name_w), "encoding") + lengths + format(" %9s %9s\n", "last/1x", "tok/s");
  for (const StudyResult& r : run.results)
    t += table_row(run, r.name, name_w, points_at(r, std::nullopt), format(" %9.0f", r.tokens_per_second));
  if (!acc || *cfg.task != Task::kPasskey) return t;
  // passkey: the same examples' keys placed at each depth
  t += format("\npasskey accuracy by depth (the key's start at that fraction of the filler), %lld examples "
              "per length and depth%s\n", (long long)cfg.eval_examples, seeds.c_str());
  t += format("%-*s %5s", int(name_w), "encoding", "depth") + lengths + format(" %9s\n", "last/1x");
  for (const StudyResult& r : run.results)
    for (double d : passkey_depths())
      t += table_row(run, format("%-*s %5.2f", int(name_w), r.name.c_str(), d), name_w + 6, points_at(r, d), "");
  return t;
}

Expected<std::vector<StudyEntry>> read_results_json(const std::string& path) {
  namespace fs = std::filesystem;
  const auto bad = [&](const std::string& what) {
    return Status::Invalid("study", path + ": " + what + " (expected posenc study's results.json)");
  };
  std::error_code ec;
  if (!fs::is_regular_file(fs::status(path, ec))) return bad("not a regular file");
  std::ifstream f(path);
  if (!f) return Status::Io("study", "cannot read " + path);
  const json j = json::parse(f, nullptr, false);
  if (j.is_discarded()) return bad("not valid JSON");
  if (!j.is_object() || !j.contains("encodings") || !j["encodings"].is_array())
    return bad("no \"encodings\" array");
  std::vector<StudyEntry> out;
  for (const json& r : j["encodings"]) {
    if (!r.is_object() || !r.contains("encoding") || !r["encoding"].is_string())
      return bad("an entry of \"encodings\" without an \"encoding\" name");
    StudyEntry entry{r["encoding"].get<std::string>(), {}};
    const std::string& name = entry.encoding;
    if (!r.contains("eval") || !r["eval"].is_array() || r["eval"].empty())
      return bad("\"" + name + "\" has no \"eval\" rows");
    for (const json& e : r["eval"]) {
      if (e.is_object() && e.contains("depth")) continue;  // passkey by depth: the random rows are the curve
      if (!e.is_object() || !e.contains("len") || !e["len"].is_number_integer() || e["len"].get<std::int64_t>() < 1)
        return bad("\"" + name + "\": an \"eval\" row without a positive integer \"len\"");
      const bool has = e.contains("ppl");
      const json p = has ? e["ppl"] : json();
      const bool positive = p.is_number() && std::isfinite(p.get<double>()) && p.get<double>() > 0;
      if (!has || !(p.is_null() || positive))
        return bad("\"" + name + "\": an \"eval\" row whose \"ppl\" is not a positive number or null");
      EvalPoint pt;
      pt.len = e["len"].get<std::int64_t>();
      if (positive) pt.ppl = p.get<double>();
      entry.eval.push_back(pt);
    }
    out.push_back(std::move(entry));
  }
  return out;
}

bool write_file(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  // flushed to disk before the caller renames it into place
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
                     ::fsync(::fileno(f)) == 0;
  const int e = errno;
  const bool closed = std::fclose(f) == 0;
  if (wrote) return closed;
  errno = e;
  return false;
}

}  // namespace posenc
