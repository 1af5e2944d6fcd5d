// posenc/study.h — the study: train the tiny model of model.h once per encoding at one length, then
// measure perplexity on the same held-out bytes at 1×, 2×, 4×, … that length (`posenc study`).
//
// Corpus: bytes of UTF-8 text (the model's vocabulary is the 256 byte values). The built-in corpus is
// the King James Bible from Debian's bible-kjv (`bible "Gen1:1-Rev22:21"`), whitespace runs folded
// to one space; the last 10% is held out, the rest trains. Training windows start at positions drawn
// from a seeded std::mt19937_64; evaluation cuts the first `eval_tokens` held-out bytes into
// non-overlapping windows of each length and scores every byte of every window (a window's first
// bytes have little context, so short windows score worse even for a perfect extrapolator).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "study/model.h"
#include "posenc/status.h"

namespace posenc {

struct Corpus {
  std::string name;                       // "bible-kjv" or the file's path
  std::vector<std::int32_t> train, held;  // byte ids
};

// The built-in corpus (runs `bible`), or a UTF-8 text file of at most 2^28 bytes. Errors name "corpus".
Expected<Corpus> load_corpus(const std::string& path_or_empty);
// A corpus from text (split 90/10 like the others).
Corpus corpus_from_text(std::string name, const std::string& text);

// The synthetic tasks (src/study/tasks.cc): copy, flipflop, counting, selective-copy, passkey.
enum class Task { kCopy, kFlipFlop, kCounting, kSelectiveCopy, kPasskey };
const char* task_name(Task t);
Expected<Task> parse_task(const std::string& s);
// One example of `len` bytes: tokens [len], targets [len] (−1 where not scored). `depth` (passkey
// only, a fraction in [0, 1]) puts the key's start before filler byte round(depth · filler bytes)
// instead of at a random place; the key's digits are drawn from rng as without it.
Status make_example(Task task, std::int64_t len, std::mt19937_64& rng, std::int32_t* tokens,
                    std::int32_t* targets, std::optional<double> depth = std::nullopt);
// The depths at which passkey is evaluated: 0, 0.25, 0.5, 0.75, 1 (0: the key first; 1: just before
// the question).
const std::vector<double>& passkey_depths();

struct StudyConfig {
  std::vector<Encoding> encodings;           // in this order
  ModelConfig model;                         // encoding and max_len are set per run
  AdamWConfig opt;                           // total = steps
  std::int64_t train_len = 64;
  std::int64_t steps = 600;
  std::int64_t batch = 16;
  std::vector<std::int64_t> eval_multiples = {1, 2, 4, 8, 16};
  std::int64_t eval_tokens = 16384;          // held-out bytes scored at every length
  std::uint64_t seed = 1;                    // the first seed; seeds run seed, seed + 1, …
  std::int64_t seeds = 1;                    // trainings per encoding (each its own seed)
  std::optional<Task> task;                  // set: train and score on the task instead of the corpus
  std::int64_t eval_examples = 64;           // task: examples scored at every length
  bool extend = false;                       // RoPE's context extension (study/extend.h) instead
};

struct EvalPoint {
  std::int64_t len = 0;
  std::optional<double> ppl;  // absent where the encoding cannot run (learned past its table)
  std::optional<double> acc;  // task: fraction of scored bytes predicted exactly (argmax)
  // Over seeds (a merged result of two or more trainings): the sample standard deviations (n − 1)
  // of ppl and acc, which then hold the means.
  std::optional<double> ppl_sd, acc_sd;
  std::optional<double> depth;  // passkey: the key placed at this depth (absent: at a random place)
};

// One training's evaluation (a row of the study), or the mean over its seeds once merged.
struct StudyResult {
  std::string name;  // the row: the encoding's name (run_one), or a scheme's row of --extend
  Encoding encoding = Encoding::kNope;
  std::vector<std::uint64_t> seeds;  // the seed of this training; once merged, every seed's
  std::vector<std::vector<EvalPoint>> per_seed;  // merged: each seed's eval, in `seeds`' order
  std::vector<EvalPoint> eval;
  double final_train_loss = 0;  // mean of the last 20 steps
  double train_seconds = 0, tokens_per_second = 0;
};

// The training windows: `batch` windows of `len` + 1 bytes of the training text, at offsets drawn from
// std::mt19937_64(seed·φ + 1) (φ = 0x9E3779B97F4A7C15), the same for every encoding.
class Batcher {
 public:
  Batcher(const Corpus& c, std::int64_t len, std::int64_t batch, std::uint64_t seed);
  // tokens, targets [batch, len]: targets are the tokens one byte on.
  void next(std::int32_t* tokens, std::int32_t* targets);

 private:
  const Corpus* c_;
  std::int64_t len_, batch_;
  std::mt19937_64 rng_;
};

// One optimisation step on a batch; returns the mean loss (grad_norm: the norm before clipping).
Expected<double> train_step(Model<float>& m, AdamW& opt, const std::int32_t* tokens,
                            const std::int32_t* targets, std::int64_t batch, std::int64_t len,
                            double* grad_norm = nullptr);

// Progress: job index (study/jobs.h), steps done for it (steps + 1 while evaluating), and the last loss.
using StudyProgress = std::function<void(std::size_t enc, std::int64_t step, double loss)>;

// Perplexity per byte of `model` on the first E held-out bytes, cut into E / len windows of len bytes.
Expected<double> held_out_ppl(Model<float>& model, const Corpus& corpus, std::int64_t E, std::int64_t len);

// The evaluation of `model` at length len: for the corpus, one point of perplexity on the first
// cfg.eval_tokens held-out bytes (held_out_ppl); for a task, one point of accuracy and perplexity on
// cfg.eval_examples examples from `task_rng`, then for passkey one point per depth of
// passkey_depths(), each on cfg.eval_examples examples from std::mt19937_64(seed·φ + 4) (the same
// keys at every depth). `runs`: false gives the points with no values (learned past its table).
Expected<std::vector<EvalPoint>> evaluate_at(const StudyConfig& cfg, const Corpus& corpus, Model<float>& model,
                                             std::int64_t len, std::uint64_t seed, std::mt19937_64& task_rng,
                                             bool runs = true);

// The training examples of a task: `batch` examples of `len` bytes from rng.
Status task_batch(Task task, std::int64_t len, std::int64_t batch, std::mt19937_64& rng, std::int32_t* tokens,
                  std::int32_t* targets);

// Trains one model at cfg.train_len with `seed` (its parameters, training windows and, for a task,
// its examples; model config: cfg.model with the encoding set; learned's table is train_len rows)
// and evaluates it. `index` is passed on to `progress`.
Expected<StudyResult> run_one(const StudyConfig& cfg, const Corpus& corpus, Encoding e, std::uint64_t seed,
                              std::size_t index, const StudyProgress& progress);

}  // namespace posenc
