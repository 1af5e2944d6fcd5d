// study/extend.h — RoPE's context extension (`posenc study --extend`): RoPE trained at L, then
// evaluated at 1 … 16 L with each scaling scheme, zero-shot and after a short fine-tune at 4 L.
//
// Rows of one seed's job:
//   rope           the trained model as it is, at every length;
//   <scheme>       zero-shot: the scheme at factor s = len / L (original_max_position L where the
//                  scheme reads it) at each evaluation length, with the scheme's attention factor
//                  (YaRN's 0.1·ln s + 1; none for the others);
//   rope+ft        a copy fine-tuned at 4 L with plain RoPE (the control);
//   <scheme>+ft    a copy fine-tuned at 4 L with the scheme at s = 4, then evaluated with s = 4 at
//                  every length.
// Schemes: linear (Chen et al. 2023), ntk, dynamic, yarn (Peng et al. 2023), llama3. Every
// fine-tune runs the same steps on the same windows: steps / 10 steps (at least one) of
// max(1, batch / 4) windows of 4 L bytes (the tokens of a training step), AdamW as in training with
// peak lr / 3 and warm-up of a tenth of the steps, windows drawn from Batcher(seed + 4096).
//
// With a task (cfg.task) the same rows measure the task's accuracy (study.h, evaluate_at: passkey by
// length and depth): RoPE trained on the task's examples as run_one trains it (so the `rope` row is
// run_one's), and every fine-tune on examples of 4 L from std::mt19937_64((seed + 4096)·φ + 2).
#pragma once

#include <vector>

#include "study/study.h"
#include "posenc/status.h"

namespace posenc {

// The schemes compared, in the order of the rows.
std::vector<RopeType> extend_schemes();

// RoPE's parameters for `scheme` at factor s, trained at length L.
RopeParams extend_rope(RopeType scheme, double s, std::int64_t L);

// One seed's rows (above). cfg.encodings is ignored (RoPE).
Expected<std::vector<StudyResult>> run_extend(const StudyConfig& cfg, const Corpus& corpus, std::uint64_t seed,
                                              std::size_t index, const StudyProgress& progress);

}  // namespace posenc
