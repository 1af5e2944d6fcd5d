// The sinusoidal encoding's fast kernels, as the dispatcher (sinusoidal_cpu.cc) calls them: one job
// of rows y = x + PE, its constants, and the rotation tables (sinusoidal_kernels.cc).
#pragma once

#include <cstdint>

#include "posenc/view.h"

namespace posenc::sinus_fast {

// Rows per exact anchor block; rows per double carry and float rotation table (K, float32 and
// float16); rows per pass of the rotated kernels; rows per re-anchored stretch of the bfloat16
// recurrence (its table holds every kReanchor-th row).
constexpr std::int64_t kRun = 64;
constexpr std::int64_t kK = 8;
constexpr int kRows = 4;
constexpr std::int64_t kReanchor = 16;
static_assert(kK % kRows == 0 && kReanchor % kRows == 0 && kRun % kReanchor == 0,
              "a pass stays inside a group and a stretch");

struct Job {
  DType dtype = DType::kF32;
  std::int64_t B = 0, L = 0, D = 0;
  const std::int64_t* pos = nullptr;  // [B, L]
  bool shared = false;                // every batch row has the positions of row 0
  const double* inv = nullptr;        // [D/2]: w_i
  const double* cK = nullptr;         // [D/2]: cos(K·w_i) (float32, float16)
  const double* sK = nullptr;         // [D/2]: sin(K·w_i)
  // cos, sin(k·w) rounded to float (null: no runs, L = 1). bfloat16, per pair: tc, ts
  // [kRun/kReanchor + 1, D/2], row m the angle m·kReanchor·w_i, the last row w_i itself (the
  // recurrence's step). Other dtypes, k < K, interleaved in tc [K, D] (cos(k·w_i), sin(k·w_i) at
  // columns 2i, 2i + 1; ts unused): one table row per PE row instead of two.
  const float* tc = nullptr;
  const float* ts = nullptr;
  std::int64_t tlen = 0;  // floats in tc (and in ts)
  const void* x = nullptr;            // [B, L, D] or null (the table: y = PE)
  void* y = nullptr;                  // [B, L, D]
  std::int64_t xs[2] = {0, 0}, ys[2] = {0, 0};
  int threads = 1;
  bool stream = false;  // large, and out of place or the table: non-temporal stores
};

// The job's rows on the best SIMD target of this CPU.
void run(const Job& j);

// The rotation tables of frequencies w [n] (Job's cK, sK, tc, ts; columns: the float32 and float16
// form, else bfloat16's per pair).
void tables(const double* w, std::int64_t n, bool columns, double* cK, double* sK, float* tc, float* ts);

}  // namespace posenc::sinus_fast
