// posenc/absolute.h — absolute encodings, added to the token embeddings once, before the first layer.
//
//   learned     y[b,l,:] = x[b,l,:] + E[pos(b,l), :]      E: [max_len, D], pos ≥ max_len is an error
//               (BERT/GPT-2; seeds 000 and 001). Backward: dx = dy, dE[p] = Σ_{(b,l): pos=p} dy[b,l].
//   sinusoidal  y = x + PE[pos],  PE[p, 2i] = sin(p / base^(2i/D)), PE[p, 2i+1] = cos(p / base^(2i/D))
//               (Vaswani et al. 2017, §3.5). D must be even. Backward: dx = dy. The frequencies
//               base^(−2i/D) must stay <= 2^969 (a base far below 1 makes them huge), so that every
//               angle at |p| <= 2^53 is finite: an error naming base otherwise. The fast path
//               (float32, bfloat16, float16) hands a call with an angle beyond 2^47 to the reference.
//
// x, y: [B, L, D], float32, float64, bfloat16 or float16 (y has x's dtype; y may alias x).
// Positions: see view.h (|position| <= 2^53).
#pragma once

#include "posenc/view.h"

namespace posenc {

struct SinusoidalParams {
  double base = 10000.0;  // seed 003's worked example uses 100
};

struct LearnedParams {};  // the table is a tensor argument; its rows give max_len

// PE rows for positions offset .. offset+L-1 (or the given ids, shape [L]) into out [L, D].
Status sinusoidal_table(const SinusoidalParams& p, const Positions& pos, const View& out);

Status sinusoidal_forward(const SinusoidalParams& p, const View& x, const Positions& pos, const View& y);
Status sinusoidal_backward(const SinusoidalParams& p, const View& dy, const Positions& pos, const View& dx);

Status learned_forward(const LearnedParams& p, const View& x, const View& table, const Positions& pos,
                       const View& y);
// dx: [B, L, D] (optional); dtable: [max_len, D] (optional), overwritten with the scatter-add of dy.
Status learned_backward(const LearnedParams& p, const View& dy, const View& table, const Positions& pos,
                        const View& dx, const View& dtable);

}  // namespace posenc
