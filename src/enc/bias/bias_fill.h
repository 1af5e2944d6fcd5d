// Private: the fast fill of a relative-position bias [H, M, N] (ALiBi, T5) from a per-head table.
//
// Such a bias depends on (h, i, j) only through the distance r = (k_offset + j) − (q_offset + i),
// so row (h, i) is the contiguous slice lut[h][M−1−i .. M−1−i+N) of a per-head table over the M+N−1
// distances r_min .. r_max (r_min = k_offset − q_offset − (M−1)). The table holds the reference's
// own double values rounded once to the output dtype, so the fast bias equals the reference bit for
// bit; filling is a row copy (memcpy's SIMD), OpenMP over rows. The backward reduces dbias the
// other way round: per distance first (diagonal_sums), then per parameter.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/fast_common.h"
#include "posenc/bias.h"

namespace posenc::bias {

// Whether the fast fill takes `out` (any dtype; last dimension contiguous).
inline bool fill_ok(const View& out) { return fast::inner_contiguous(out); }

// lut: [H, W = M+N−1] in double, lut[h][w] = bias at distance r_min + w. Writes out [H, M, N].
inline void fill_from_lut(const BiasGeometry& g, const std::vector<double>& lut, const View& out) {
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  if (H * M * N == 0) return;
  const std::int64_t W = M + N - 1;
  const std::size_t es = dtype_size(out.dtype);
  std::vector<unsigned char> typed(static_cast<std::size_t>(H * W) * es);  // lut in out's dtype
  from_doubles(lut, View::contiguous(typed.data(), out.dtype, {H, W}));
  const std::int64_t rows = H * M;
  const int threads = fast::threads_for(H * M * N);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (std::int64_t t = 0; t < rows; ++t) {
    const std::int64_t h = t / M, i = t % M;
    std::memcpy(static_cast<char*>(out.data) + (h * out.strides[0] + i * out.strides[1]) * static_cast<std::int64_t>(es),
                typed.data() + static_cast<std::size_t>(h * W + (M - 1 - i)) * es, static_cast<std::size_t>(N) * es);
  }
}

// Whether diagonal_sums takes dbias (float32, bfloat16 or float16; last dimension contiguous).
inline bool sums_ok(const View& dbias) {
  return fast::fast_dtype(dbias.dtype) && fast::inner_contiguous(dbias);
}

// The backward of a bias that depends on (h, i, j) only through the distance: S [H, W = M+N−1],
// S[h][w] = Σ_i dbias[h, i, w − (M−1−i)] over the rows i that reach w, i.e. the sum of dbias over
// the (query, key) pairs at distance r_min + w (row (h, i) is the slice w ∈ [M−1−i, M−1−i+N), as in
// fill_from_lut). In double, rows added in order i = 0 .. M−1 with Highway vector adds
// (alibi_cpu.cc); OpenMP over heads. dbias: [H, M, N] accepted by sums_ok.
std::vector<double> diagonal_sums(const BiasGeometry& g, const View& dbias);

}  // namespace posenc::bias
