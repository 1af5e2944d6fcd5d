// posenc/absolute.h — absolute encodings (learned, sinusoidal), added to the token embeddings once.
// Formulas, ranges and sources: docs/absolute.md.
#pragma once

#include "posenc/view.h"

namespace posenc {

// The sinusoid's wavelength base (finite, > 0).
struct SinusoidalParams {
  double base = 10000.0;  // PE[p, 2i] = sin(p / base^(2i/D)), PE[p, 2i+1] = cos(p / base^(2i/D))
};

struct LearnedParams {};  // the table is a tensor argument; its rows give max_len

// PE rows for positions offset .. offset+L-1 (or the given ids, shape [L]) into out [L, D] (D even).
// A base whose frequencies exceed 2^969 is an error naming base.
Status sinusoidal_table(const SinusoidalParams& p, const Positions& pos, const View& out);

// y = x + PE[pos] for x, y [B, L, D] (float32, float64, bfloat16, float16; y has x's dtype and may
// alias x). Errors name the argument or base.
Status sinusoidal_forward(const SinusoidalParams& p, const View& x, const Positions& pos, const View& y);
// dx = dy (PE has no parameters), with sinusoidal_forward's shapes and errors.
Status sinusoidal_backward(const SinusoidalParams& p, const View& dy, const Positions& pos, const View& dx);

// y[b, l] = x[b, l] + table[pos(b, l)] for x, y [B, L, D] and table [max_len, D]; a position ≥
// max_len is an error (out of range) naming positions.
Status learned_forward(const LearnedParams& p, const View& x, const View& table, const Positions& pos,
                       const View& y);
// dx: [B, L, D] (optional); dtable: [max_len, D] (optional), overwritten with the scatter-add of dy.
Status learned_backward(const LearnedParams& p, const View& dy, const View& table, const Positions& pos,
                        const View& dx, const View& dtable);

}  // namespace posenc
