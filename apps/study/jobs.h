// study/jobs.h — a study as independent jobs: one job is one training and its evaluation, named by a
// stable id. A local run and a planned sweep (`--plan DIR`, then `--merge DIR`) go through the same
// merge (merge_runs), so they write the same files bit for bit. docs/study.md describes the files.
//
// A plan directory holds plan.json (the configuration and the job ids), jobs.txt (one shell command
// per job, in plan order), slurm.sbatch (an array job running line $SLURM_ARRAY_TASK_ID of jobs.txt)
// and jobs/, where each job writes jobs/<id>.json (its configuration and results) atomically.
#pragma once

#include <string>
#include <vector>

#include "study/results.h"
#include "study/study.h"
#include "posenc/status.h"

namespace posenc {

// One training and its evaluation.
struct StudyJob {
  std::string id;  // "<encoding>-s<seed>", e.g. "rope-s2" ("extend-s<seed>" for --extend)
  Encoding encoding = Encoding::kNope;
  std::uint64_t seed = 1;
};

// The jobs of cfg: each encoding in order, each with seeds cfg.seed … cfg.seed + cfg.seeds − 1
// (cfg.extend: one job per seed, study/extend.h).
std::vector<StudyJob> plan_jobs(const StudyConfig& cfg);

// Runs one job: its rows (one for an encoding; run_extend's for --extend), each with the job's seed.
// `index` is passed on to `progress`.
Expected<std::vector<StudyResult>> run_job(const StudyConfig& cfg, const Corpus& corpus, const StudyJob& job,
                                           std::size_t index, const StudyProgress& progress);

// A job's rows as one line of JSON (a JSON array of result_to_json objects), and read back exactly;
// any other text is an error naming "result".
std::string job_rows_to_json(const std::vector<StudyResult>& rows);
Expected<std::vector<StudyResult>> job_rows_from_json(const std::string& text);

// The merged study: per row name (in the order the jobs first give it), the mean over seeds at every
// length with the sample standard deviation (n − 1) where there are two seeds or more; a length where
// any seed has no value has none. `rows` holds each job's rows in plan_jobs' order.
StudyRun merge_runs(const StudyConfig& cfg, const std::string& preset, const std::string& corpus,
                    const std::vector<std::vector<StudyResult>>& rows);

// The configuration that fixes a study's numbers (preset, corpus name, lengths, steps, batch, seeds,
// task, encodings) as a JSON object's text, and read back; errors name "plan".
std::string study_config_json(const StudyConfig& cfg, const std::string& preset, const std::string& corpus);
struct PlannedStudy {
  StudyConfig cfg;
  std::string preset, corpus;
};
Expected<PlannedStudy> study_config_from_json(const std::string& text);

// Writes dir/plan.json, dir/jobs.txt (commands[i] is jobs[i]'s line), dir/slurm.sbatch and makes
// dir/jobs/; each file written beside its destination and renamed into place. Errors name "plan".
Status write_plan(const std::string& dir, const StudyConfig& cfg, const std::string& preset,
                  const std::string& corpus, const std::vector<StudyJob>& jobs,
                  const std::vector<std::string>& commands);

// Writes dir/jobs/<id>.json (the configuration and the job's rows) atomically. Errors name "out".
Status write_job_file(const std::string& dir, const StudyConfig& cfg, const std::string& preset,
                      const std::string& corpus, const StudyJob& job, const std::vector<StudyResult>& rows);

// Reads a plan directory and merges its finished jobs. Errors name "merge": no plan.json, a job file
// that is not one, a job of another configuration or not in the plan, two files for one job, and
// jobs missing (their ids listed).
Expected<StudyRun> merge_plan_dir(const std::string& dir);

}  // namespace posenc
