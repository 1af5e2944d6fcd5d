// study/run.h — a whole study: the presets, the encodings trained (in worker processes when there are
// threads for more than one at a time), and the files written at the end — results.json,
// results.csv and the picture of perplexity (accuracy for a task) against length, drawn by gnuplot.
//
// Nothing here exits or prints to stdout: errors are Status values naming the study's argument
// ("preset", "out"), progress goes to the caller's callback.
#pragma once

#include <string>
#include <vector>

#include "study/jobs.h"
#include "study/results.h"
#include "study/study.h"
#include "posenc/status.h"

namespace posenc {

// The presets: "quick" finishes in a few minutes on 2 cores (one seed), "full" trains a larger model
// for longer, three seeds per encoding. No encodings are set. Any other name is an error naming "preset".
Expected<StudyConfig> study_preset(const std::string& name);

// Whether the study's model takes encoding e: Ok, or validate_config's error naming "encoding".
Status model_takes(Encoding e);

// The encodings the model takes, in catalogue order (the default of a study).
std::vector<Encoding> study_encodings();

// How `threads` threads run `jobs` jobs (study/jobs.h): W = min(threads, jobs) workers of
// threads / W threads each (at least one); one worker trains in this process.
struct WorkerPlan {
  int workers = 1, threads_per_worker = 1;
};
WorkerPlan plan_workers(int threads, std::size_t jobs);

struct RunOptions {
  std::string preset = "quick";  // recorded in results.json
  int threads = 1;               // in all, split by plan_workers
};

// Runs every job of plan_jobs(cfg) (plan_workers(opt.threads, …) at a time; this process's thread
// count set to the plan's threads per worker) and merges their rows (merge_runs: the same merge as
// merge_plan_dir, so a local run and a merged sweep write the same files). `progress` is called in
// this process with job indices.
Expected<StudyRun> run_study(const StudyConfig& cfg, const Corpus& corpus, const RunOptions& opt,
                             const StudyProgress& progress);

// The files a study writes into its directory: results.json, results.csv, and ppl_vs_length.png
// (acc_vs_length.png for a task).
std::vector<std::string> study_files(const StudyConfig& cfg);

// The gnuplot script drawing the run's perplexity (accuracy) against evaluation length into `png`:
// log x axis, one styled curve per encoding, data inline.
std::string study_plot_script(const StudyRun& run, const std::string& png);

// Writes study_files into `dir` (made when missing): each written beside its destination and all
// renamed into place together once the picture is drawn, or none of them (a directory made here is
// removed again). Errors are Status::Io naming "out".
Status write_study(const std::string& dir, const StudyRun& run);

}  // namespace posenc
