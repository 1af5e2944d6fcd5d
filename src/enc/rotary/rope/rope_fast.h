// Private: the interface of RoPE's fast kernel (rope_cpu.cc dispatches to it), which every rotary
// encoding's fast path runs: RoPE itself (1D positions and its frequencies) and, through a
// rotary::Plan, rope2d, mrope and xpos (rotary.h). The Highway code is rope_kernels.cc's; this
// header is plain C++.
#pragma once

#include <cstdint>
#include <vector>

#include "enc/rotary/rotary_plan.h"
#include "posenc/view.h"

namespace posenc::rope_fast {

struct Tensor {
  const void* in = nullptr;  // [B, L, H, D]
  void* out = nullptr;       // [B, L, H, D]
  std::int64_t H = 0, D = 0;
  std::int64_t is[3] = {0, 0, 0}, os[3] = {0, 0, 0};  // element strides of b, l, h
};

struct Job {
  DType dtype = DType::kF32;
  bool interleaved = true;
  std::int64_t B = 0, L = 0, r = 0;
  const std::int64_t* pos = nullptr;  // [B, L]; with a plan [B, axes, L]
  const double* inv = nullptr;        // [r/2] ω_k (hf: the float32 values); unused with a plan
  double sign = 1.0;                  // +1 forward, −1 backward
  bool hf = false;                    // angles fl32(ω_k·fl32(m)) instead of m·ω_k
  float scale = 1.0f;                 // the attention factor a (without a plan)
  const rotary::Plan* plan = nullptr;  // rope2d, mrope, xpos: angle and a·ρ per pair from the plan
  int role = 1;                        // xpos: +1 queries, −1 keys
  Tensor t[2];
  int nt = 0;
  int threads = 1;
  bool stream = false;    // out of place and large: non-temporal stores where aligned
};

// Whether the kernel takes (in, out): float32 / bfloat16 / float16, innermost dimension contiguous,
// no partial overlap (in place is fine).
bool kernel_ok(const View& in, const View& out);

// Whether every angle of the call lies in the kernel's range, |φ| <= fast::kMaxFastAngle (2^47);
// otherwise the encoding runs its reference.
bool angles_ok(const rotary::Call& c);

// Rotates in → out ([B, L, H, D], validated, kernel_ok) by the call's plan: a·ρ·R(sign·φ) per pair
// (sign −1: the transpose, the backward); role +1 queries, −1 keys (xpos).
void run_plan(const rotary::Call& c, const View& in, const View& out, double sign, int role);

// Mixed: dfreqs [2, heads, r/2] = Σ over tokens of (x, y)·∂L/∂φ, from the forward's input x and the
// upstream gradient dy (both kernel_ok-able views of the same dtype); summed per thread in double,
// then in thread order.
void mixed_freq_grad(const rotary::Call& c, const View& x, const View& dy, std::vector<double>* dfreqs);

// The kernel (rope_kernels.cc) on the best SIMD target of this CPU: the job's rows rotated, or
// (mixed_grad) each thread's part of mixed_freq_grad's sums added into part[thread], dy's strides ds.
void run(const Job& j);
void mixed_grad(const Job& j, const void* dy, const std::int64_t* ds, std::vector<std::vector<double>>* part);

}  // namespace posenc::rope_fast
