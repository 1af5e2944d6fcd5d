// Private: the CoPE kernel's per-tile SIMD steps (attention_cope_tiles.cc: Highway, every target
// compiled, the best chosen at run time) and their arguments; attention_cope_cpu.cc runs them.
#pragma once

#include <cstdint>

namespace posenc::cope_fast {

using I = std::int64_t;

// Counts are held as an integer part K (a float holding an integer) plus a fraction r ∈ [0, 1):
// adding a gate to r rounds by at most 2^-24 (half an ulp below 2) however large the count,
// ⌊p⌋ = K and w = r need no floor, and clamping (S ≥ top, top an integer) is the exact test
// K ≥ top.
//
// One forward tile, At [nk, Bq] transposed (row j: key j0 + j; lane i: query i). The per-query
// state arrays have Bq entries; lanes past nq are computed on (as masked) and ignored.
struct FwdTile {
  float* at = nullptr;  // in: scale·k_j·q_i; out: exp(logit − m_new), 0 where masked
  I nk = 0, nq = 0, j0 = 0;
  bool causal = false;
  I base = 0;              // causal: (j, i) masked when i < j + base
  bool saturated = false;  // every row's count is already ≥ top: the whole tile is clamped
  bool track = false;      // record js, uk, ur (the backward's pass 1)
  const float* qe = nullptr;              // [Bq, ncol]: q_i·e_r
  const std::int32_t* rowbase = nullptr;  // [Bq]: i·ncol
  const float* qetop = nullptr;           // [Bq]: q_i·e_{ncol − 1}
  float top = 0, colmax = 0;              // npos − 1, ncol − 1
  const float* ck = nullptr;  // count of the keys right of the tile: integer part
  const float* cr = nullptr;  //   and fraction
  float* tk = nullptr;        // out: Σ of the tile's gates, integer part
  float* tr = nullptr;        //   and fraction
  std::int32_t* js = nullptr;  // in/out: the leftmost unclamped key so far (j*)
  float* uk = nullptr;         // in/out: its count, integer part
  float* ur = nullptr;         //   and fraction
  float* m = nullptr;          // in/out: running max
  float* l = nullptr;          // in/out: running sum
  float* corr = nullptr;       // out: e^{m_old − m_new}
};

// One backward tile: At as above, dPt [nk, Bq] = dO_i·v_j.
struct BwdTile {
  float* at = nullptr;  // in: scale·k_j·q_i; out: P
  float* dp = nullptr;  // in: dO_i·v_j; out: da = ∂L/∂(scale·q_i·k_j)
  I nk = 0, nq = 0, j0 = 0;
  bool causal = false;
  I base = 0;
  bool clamped = false;  // every key of the tile lies left of every row's j*
  const float* qe = nullptr;  // [Bq rows, ncol] of the block (rows past nq readable)
  float* c = nullptr;         // [Bq rows, ncol] of the block (rows past nq writable: they get + 0)
  const std::int32_t* rowbase = nullptr;
  const float* qetop = nullptr;
  float top = 0, colmax = 0;
  const float* lse = nullptr;  // [Bq] (+inf for a row with no key: P = 0)
  const float* dd = nullptr;   // [Bq] D_i = dO_i·out_i
  const std::int32_t* js = nullptr;  // [Bq] j*
  const float* bk = nullptr;  // [Bq] count at the tile's first key: U_i − (gates from j* passed),
  const float* br = nullptr;  //   integer part and fraction
  float* tk = nullptr;        // out: Σ of the tile's gates from j* on, integer part
  float* tr = nullptr;        //   and fraction
  float* dc = nullptr;        // in/out: dp prefix carry
  float* ctop = nullptr;      // out (clamped tiles): Σ_j dl
};

struct Kernels {
  void (*fwd)(const FwdTile&);
  void (*bwd)(const BwdTile&);
};


// The best target's steps on this CPU (not cached: the tests switch targets between calls).
Kernels kernels();

}  // namespace posenc::cope_fast
