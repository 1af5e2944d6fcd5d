// study/results.h — a study's results as text: one result as a JSON line (the workers send theirs to
// the parent so), results.json, results.csv and the table `posenc study` prints, and results.json
// read back (`posenc check`'s extrapolation column).
#pragma once

#include <string>
#include <vector>

#include "study/study.h"
#include "posenc/status.h"

namespace posenc {

// A finished study: its configuration, where and how it ran, and one merged row per encoding (or per
// scheme of --extend): the mean over seeds, with each seed's values (study/jobs.h, merge_runs).
struct StudyRun {
  StudyConfig cfg;
  std::string preset;  // "quick" or "full"
  std::string corpus;  // the corpus's name ("bible-kjv", a path, "task copy")
  int threads = 1, workers = 1, threads_per_worker = 1;  // how it ran here (not in results.json)
  std::vector<StudyResult> results;  // in cfg.encodings' order
};

// One training's result as one line of JSON (its row name, the encoding by its number, its seed,
// eval, loss and speed); doubles are written so that they read back exactly.
std::string result_to_json(const StudyResult& r);
// The result result_to_json wrote; an error (naming "result") for any other text.
Expected<StudyResult> result_from_json(const std::string& line);

// results.json: the run's settings and, per row ("encoding": its name), its seeds, mean loss and
// evaluation rows: "len", "ppl" ("acc" only for a task; the mean over seeds) and, with two seeds or
// more, "ppl_sd" (sample sd) and "ppl_seeds" (each seed's value; "acc_sd", "acc_seeds" likewise);
// passkey's rows at a depth (study.h, evaluate_at) have "depth", its rows at random places none.
// A missing value is null. Nothing that depends on the machine (times, threads): a study gives the
// same file however it ran. Ends with a newline.
std::string results_json(const StudyRun& run);
// results.csv: "encoding,len,ppl" (",ppl_sd" with two seeds or more; ",acc" and ",acc_sd" for a
// task), one row per encoding and length; a missing value is an empty field. Passkey has a "depth"
// column after "len" (empty for the random placement) and a row per length and depth.
std::string results_csv(const StudyRun& run);
// The table: a title line, then per row its perplexity (accuracy for a task) at every length (mean ±
// sd with two seeds or more), the last mean over the first ("last/1x") and tokens per second (mean
// over seeds); a missing value is "-". Passkey's table is of the random placement, followed by a
// second table of one row per encoding and depth.
std::string results_table(const StudyRun& run);

// One encoding of a results.json as read back.
struct StudyEntry {
  std::string encoding;
  std::vector<EvalPoint> eval;  // len >= 1 and ppl (a positive number or absent) in every row
};
// Reads a study's results.json whole (passkey's rows at a depth are skipped). A file that is not the study's shape is an error naming
// "study" and the field: "<path>: \"rope\" has no \"eval\" rows (expected posenc study's
// results.json)".
Expected<std::vector<StudyEntry>> read_results_json(const std::string& path);

// Writes text to path; false (errno kept) when any of it did not reach the file (a full disk).
bool write_file(const std::string& path, const std::string& text);

}  // namespace posenc
