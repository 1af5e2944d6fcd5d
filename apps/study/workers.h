// study/workers.h — the study's encodings trained in parallel by worker processes.
//
// W worker processes, forked before any OpenMP region of theirs, each run one job (study/jobs.h) at a
// time with its own thread count (W workers of one thread each give the numbers of one process of one
// thread, bit for bit). A worker takes the next job's index from the parent over a pipe and sends
// back progress lines and each job's rows as a JSON line (study/jobs.h: doubles round-trip exactly).
#pragma once

#include <vector>

#include "study/jobs.h"
#include "posenc/status.h"

namespace posenc {

// Runs every job, `workers` (>= 1) at a time in child processes of `threads_per_worker` threads
// each; `progress` is called in this process as their lines arrive. Each job's rows, in jobs' order.
// A worker's failure ends the others and is the error (its message).
Expected<std::vector<std::vector<StudyResult>>> train_in_workers(const StudyConfig& cfg, const Corpus& corpus,
                                                                 const std::vector<StudyJob>& jobs, int workers,
                                                                 int threads_per_worker,
                                                                 const StudyProgress& progress);

}  // namespace posenc
