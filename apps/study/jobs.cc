// study/jobs.cc — jobs, their files, and the merge of their rows into a study.
#include "study/jobs.h"

#include "study/extend.h"
#include "study/json_int.h"
#include "study/run.h"
#include "study/temp_files.h"


#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace posenc {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

Expected<std::string> read_text(const std::string& path, const char* arg) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::Io(arg, "cannot read " + path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The mean of xs (summed in order) and their sample standard deviation (absent for one value).
void mean_sd(const std::vector<double>& xs, std::optional<double>& mean, std::optional<double>& sd) {
  double sum = 0;
  for (double x : xs) sum += x;
  const double m = sum / double(xs.size());
  mean = m;
  if (xs.size() < 2) return;
  double ss = 0;
  for (double x : xs) ss += (x - m) * (x - m);
  sd = std::sqrt(ss / double(xs.size() - 1));
}

// The merged row of one name from its seeds' rows (all of the same lengths).
StudyResult merge_row(const std::vector<const StudyResult*>& seeds) {
  StudyResult out;
  out.name = seeds.front()->name;
  out.encoding = seeds.front()->encoding;
  std::vector<double> loss, tps;
  for (const StudyResult* r : seeds) {
    out.seeds.push_back(r->seeds.empty() ? 0 : r->seeds.front());
    out.per_seed.push_back(r->eval);
    loss.push_back(r->final_train_loss);
    tps.push_back(r->tokens_per_second);
    out.train_seconds += r->train_seconds;
  }
  std::optional<double> m, sd;
  mean_sd(loss, m, sd);
  out.final_train_loss = *m;
  mean_sd(tps, m, sd);
  out.tokens_per_second = *m;
  for (std::size_t i = 0; i < seeds.front()->eval.size(); ++i) {
    EvalPoint pt;
    pt.len = seeds.front()->eval[i].len;
    pt.depth = seeds.front()->eval[i].depth;
    std::vector<double> ppl, acc;
    for (const StudyResult* r : seeds) {
      if (i >= r->eval.size()) continue;
      if (r->eval[i].ppl) ppl.push_back(*r->eval[i].ppl);
      if (r->eval[i].acc) acc.push_back(*r->eval[i].acc);
    }
    if (ppl.size() == seeds.size()) mean_sd(ppl, pt.ppl, pt.ppl_sd);
    if (acc.size() == seeds.size()) mean_sd(acc, pt.acc, pt.acc_sd);
    out.eval.push_back(pt);
  }
  return out;
}

}  // namespace

std::vector<StudyJob> plan_jobs(const StudyConfig& cfg) {
  std::vector<StudyJob> jobs;
  for (Encoding e : cfg.encodings)
    for (std::int64_t k = 0; k < cfg.seeds; ++k) {
      StudyJob j;
      j.encoding = e;
      j.seed = cfg.seed + std::uint64_t(k);
      j.id = (cfg.extend ? std::string("extend") : encoding_info(e).name) + "-s" + std::to_string(j.seed);
      jobs.push_back(j);
    }
  return jobs;
}

Expected<std::vector<StudyResult>> run_job(const StudyConfig& cfg, const Corpus& corpus, const StudyJob& job,
                                           std::size_t index, const StudyProgress& progress) {
  if (cfg.extend) return run_extend(cfg, corpus, job.seed, index, progress);
  Expected<StudyResult> r = run_one(cfg, corpus, job.encoding, job.seed, index, progress);
  if (!r.ok()) return r.status();
  return std::vector<StudyResult>{std::move(r).value()};
}

std::string job_rows_to_json(const std::vector<StudyResult>& rows) {
  std::string s = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) s += (i ? "," : "") + result_to_json(rows[i]);
  return s + "]";
}

Expected<std::vector<StudyResult>> job_rows_from_json(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array() || j.empty())
    return Status::Invalid("result", "expected a job's rows as a JSON array, got other text");
  std::vector<StudyResult> rows;
  for (const json& r : j) {
    Expected<StudyResult> one = result_from_json(r.dump());
    if (!one.ok()) return one.status();
    rows.push_back(std::move(one).value());
  }
  return rows;
}

StudyRun merge_runs(const StudyConfig& cfg, const std::string& preset, const std::string& corpus,
                    const std::vector<std::vector<StudyResult>>& rows) {
  StudyRun run;
  run.cfg = cfg;
  run.preset = preset;
  run.corpus = corpus;
  std::vector<std::string> order;
  std::map<std::string, std::vector<const StudyResult*>> by_name;
  for (const std::vector<StudyResult>& job : rows)
    for (const StudyResult& r : job) {
      if (!by_name.count(r.name)) order.push_back(r.name);
      by_name[r.name].push_back(&r);
    }
  for (const std::string& name : order) run.results.push_back(merge_row(by_name[name]));
  return run;
}

std::string study_config_json(const StudyConfig& cfg, const std::string& preset, const std::string& corpus) {
  json j;
  j["preset"] = preset;
  j["corpus"] = corpus;
  j["train_len"] = cfg.train_len;
  j["steps"] = cfg.steps;
  j["batch"] = cfg.batch;
  j["seed"] = cfg.seed;
  j["seeds"] = cfg.seeds;
  j["eval_multiples"] = cfg.eval_multiples;
  j["eval_tokens"] = cfg.eval_tokens;
  j["eval_examples"] = cfg.eval_examples;
  j["task"] = cfg.task ? json(task_name(*cfg.task)) : json(nullptr);
  j["extend"] = cfg.extend;
  j["encodings"] = json::array();
  for (Encoding e : cfg.encodings) j["encodings"].push_back(encoding_info(e).name);
  return j.dump();
}

Expected<PlannedStudy> study_config_from_json(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Invalid("plan", "expected a study's configuration as JSON");
  try {
    PlannedStudy ps;
    ps.preset = j.at("preset").get<std::string>();
    ps.corpus = j.at("corpus").get<std::string>();
    Expected<StudyConfig> cfg = study_preset(ps.preset);
    if (!cfg.ok()) return Status::Invalid("plan", cfg.status().message());
    ps.cfg = std::move(cfg).value();
    ps.cfg.train_len = json_int(j.at("train_len"));
    ps.cfg.steps = json_int(j.at("steps"));
    ps.cfg.batch = json_int(j.at("batch"));
    ps.cfg.seed = json_uint(j.at("seed"));
    ps.cfg.seeds = json_int(j.at("seeds"));
    ps.cfg.eval_multiples = json_ints(j.at("eval_multiples"));
    ps.cfg.eval_tokens = json_int(j.at("eval_tokens"));
    ps.cfg.eval_examples = json_int(j.at("eval_examples"));
    ps.cfg.extend = j.at("extend").get<bool>();
    if (!j.at("task").is_null()) {
      Expected<Task> t = parse_task(j.at("task").get<std::string>());
      if (!t.ok()) return Status::Invalid("plan", t.status().message());
      ps.cfg.task = t.value();
    }
    for (const json& n : j.at("encodings")) {
      Expected<EncodingInfo> e = find_encoding(n.get<std::string>());
      if (!e.ok()) return Status::Invalid("plan", "unknown encoding '" + n.get<std::string>() + "'");
      ps.cfg.encodings.push_back(e.value().id);
    }
    if (ps.cfg.seeds < 1 || ps.cfg.encodings.empty() || ps.cfg.eval_multiples.empty())
      return Status::Invalid("plan", "expected at least one seed, encoding and evaluation length");
    return ps;
  } catch (const json::exception& e) {
    return Status::Invalid("plan", std::string("a study's configuration without its fields (") + e.what() + ")");
  }
}

Status write_plan(const std::string& dir, const StudyConfig& cfg, const std::string& preset,
                  const std::string& corpus, const std::vector<StudyJob>& jobs,
                  const std::vector<std::string>& commands) {
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "jobs", ec);
  if (ec) return Status::Io("plan", "cannot create directory " + dir + "/jobs: " + ec.message());
  json plan;
  plan["config"] = json::parse(study_config_json(cfg, preset, corpus));
  plan["jobs"] = json::array();
  for (const StudyJob& j : jobs) plan["jobs"].push_back(j.id);
  std::string lines;
  for (const std::string& c : commands) lines += c + "\n";
  const std::string sbatch =
      "#!/bin/bash\n"
      "# One array task per line of jobs.txt: sbatch slurm.sbatch (from this directory).\n"
      "#SBATCH --job-name=posenc-study\n"
      "#SBATCH --array=1-" + std::to_string(jobs.size()) + "\n"
      "#SBATCH --cpus-per-task=1\n"
      "#SBATCH --output=slurm-%A_%a.out\n"
      "set -euo pipefail\n"
      "eval \"$(sed -n \"${SLURM_ARRAY_TASK_ID}p\" \"" + (fs::absolute(dir, ec) / "jobs.txt").string() + "\")\"\n";
  const std::pair<const char*, std::string> files[] = {
      {"plan.json", plan.dump(2) + "\n"}, {"jobs.txt", lines}, {"slurm.sbatch", sbatch}};
  for (const auto& [name, text] : files)
    if (!files::write_atomic(dir + "/" + name, text))
      return Status::Io("plan", "cannot write " + dir + "/" + name + ": " + std::strerror(errno));
  return Status::Ok();
}

Status write_job_file(const std::string& dir, const StudyConfig& cfg, const std::string& preset,
                      const std::string& corpus, const StudyJob& job, const std::vector<StudyResult>& rows) {
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "jobs", ec);
  if (ec) return Status::Io("out", "cannot create directory " + dir + "/jobs: " + ec.message());
  const std::string text = "{\"id\": " + json(job.id).dump() + ", \"config\": " +
                           study_config_json(cfg, preset, corpus) + ", \"rows\": " + job_rows_to_json(rows) + "}\n";
  const std::string path = dir + "/jobs/" + job.id + ".json";
  if (!files::write_atomic(path, text)) return Status::Io("out", "cannot write " + path + ": " + std::strerror(errno));
  return Status::Ok();
}

Expected<StudyRun> merge_plan_dir(const std::string& dir) {
  Expected<std::string> plan_text = read_text(dir + "/plan.json", "merge");
  if (!plan_text.ok()) return Status::Io("merge", dir + " has no plan.json (expected a directory of posenc study --plan)");
  const json plan = json::parse(plan_text.value(), nullptr, false);
  if (plan.is_discarded() || !plan.is_object() || !plan.contains("config") || !plan.contains("jobs") ||
      !plan["jobs"].is_array())
    return Status::Invalid("merge", dir + "/plan.json is not a study plan");
  Expected<PlannedStudy> ps = study_config_from_json(plan["config"].dump());
  if (!ps.ok()) return Status::Invalid("merge", dir + "/plan.json: " + ps.status().message());
  const std::vector<StudyJob> jobs = plan_jobs(ps->cfg);
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < jobs.size(); ++i) index[jobs[i].id] = i;
  std::vector<std::optional<std::vector<StudyResult>>> rows(jobs.size());
  std::vector<std::string> from(jobs.size());
  std::error_code ec;
  std::vector<fs::path> files;
  for (const fs::directory_entry& f : fs::directory_iterator(fs::path(dir) / "jobs", ec)) {
    const std::string name = f.path().filename().string();
    if (name.empty() || name[0] == '.' || f.path().extension() != ".json") continue;  // temporaries
    files.push_back(f.path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) {
    const std::string path = p.string();
    Expected<std::string> text = read_text(path, "merge");
    if (!text.ok()) return text.status();
    const json j = json::parse(text.value(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_string() || !j.contains("config") ||
        !j.contains("rows"))
      return Status::Invalid("merge", path + " is not a study job's file");
    const std::string id = j["id"].get<std::string>();
    if (j["config"] != plan["config"])
      return Status::Invalid("merge", path + ": job '" + id + "' ran another configuration than " + dir + "/plan.json");
    const auto at = index.find(id);
    if (at == index.end()) return Status::Invalid("merge", path + ": job '" + id + "' is not in the plan");
    if (rows[at->second])
      return Status::Invalid("merge", path + " and " + from[at->second] + " are both job '" + id + "' (a duplicate)");
    Expected<std::vector<StudyResult>> r = job_rows_from_json(j["rows"].dump());
    if (!r.ok()) return Status::Invalid("merge", path + ": " + r.status().message());
    rows[at->second] = std::move(r).value();
    from[at->second] = path;
  }
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    if (!rows[i]) missing.push_back(jobs[i].id);
  if (!missing.empty()) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 20; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 20) list += ", …";
    return Status::Invalid("merge", std::to_string(missing.size()) + " of " + std::to_string(jobs.size()) +
                                        " jobs have no file in " + dir + "/jobs: " + list);
  }
  std::vector<std::vector<StudyResult>> all;
  for (auto& r : rows) all.push_back(std::move(*r));
  return merge_runs(ps->cfg, ps->preset, ps->corpus, all);
}

}  // namespace posenc
