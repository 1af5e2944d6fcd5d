// study/workers.h — the study's encodings trained in parallel by worker processes.
//
// W worker processes, forked before any OpenMP region of theirs, each train one encoding at a time
// with its own thread count (W workers of one thread each give the numbers of one process of one
// thread, bit for bit). A worker takes the next encoding's index from the parent over a pipe and sends
// back progress lines and each result as a JSON line (study/results.h: doubles round-trip exactly).
#pragma once

#include <vector>

#include "study/study.h"
#include "posenc/status.h"

namespace posenc {

// Trains and evaluates every encoding of cfg, `workers` (>= 1) at a time in child processes of
// `threads_per_worker` threads each; `progress` is called in this process as their lines arrive.
// Results in cfg.encodings' order. A worker's failure ends the others and is the error (its message).
Expected<std::vector<StudyResult>> train_in_workers(const StudyConfig& cfg, const Corpus& corpus, int workers,
                                                    int threads_per_worker, const StudyProgress& progress);

}  // namespace posenc
