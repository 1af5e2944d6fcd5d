#pragma once
// Internal to `posenc bench`: the buffers, the cases and what a case gives the harness (bench.cc);
// the cases are in cases_elementwise.cc, cases_attention.cc and cases_decode.cc.
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "posenc/attention.h"
#include "posenc/registry.h"
#include "posenc/status.h"
#include "posenc/view.h"

namespace posenc::bench_impl {

using I = std::int64_t;

inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

// Seconds on a steady clock.
double now();

// A 64-byte aligned, first-touched buffer (first touch by the threads that will use it).
struct Mem {
  std::unique_ptr<unsigned char[], void (*)(void*)> p{nullptr, std::free};
  std::size_t bytes = 0;
  Mem(std::size_t n, int threads, unsigned char fill = 0);
  void* data() const { return p.get(); }
};
using Keep = std::vector<std::shared_ptr<Mem>>;

// Baselines, split over threads like the kernels.
void par_memcpy(void* dst, const void* src, std::size_t n, int threads);
void par_memset(void* dst, std::size_t n, int threads);
// The sum modulo 2⁶⁴ of n 8-byte words, in the CPU's widest vectors (read_sum.cc): a read of memory
// at the rate the core's loads reach.
std::uint64_t sum_words(const std::uint64_t* p, std::size_t n);

// The threads a baseline splits over: those of the kernel, which stays on the calling thread below
// fast::kParallelMin elements (a decode step; an OpenMP region would cost more than the copy).
int baseline_threads(I elements, int threads);

// The memcpy baseline of an elementwise kernel that moves `bytes` (read + written): a copy of half
// of them between two buffers of its own, so that it too reads and writes `bytes` in all.
std::function<void()> memcpy_baseline(double bytes, int threads, Keep* keep);

// What a case gives the harness for one thread count.
struct Bound {
  std::function<void()> kernel, baseline;
  double kernel_work = 0, baseline_work = 0;  // bytes (GB/s) or FLOPs (GFLOP/s) of one call
  std::string baseline_name;
  std::shared_ptr<void> keep;  // the buffers, alive while the case runs
};

struct Case {
  Case(std::string k, std::string e, std::string s, DType dt)
      : kernel(std::move(k)), encoding(std::move(e)), shape(std::move(s)), dtype(dt) {}
  std::string kernel, encoding, shape;
  DType dtype;
  std::string unit = "GB/s";
  std::string path;  // attention: attention_path(); decode rows: "decode" or "decode+vdpbf16"
  std::function<Bound(int threads)> setup;
  // Attention other than nope: nope's case of the same kernel, shape and dtype, timed in the same
  // rounds as this one for vs_nope.
  std::function<Bound(int threads)> nope_setup;
};

// A strided sample of n_elems values of dtype dt randomised (the elementwise kernels' speed does not
// depend on the values).
void fill_random(void* p, std::size_t n_elems, DType dt);
// Every element uniform in [−amp, amp) (attention inputs: the softmax and CoPE's gates see real data).
void fill_all(const View& v, std::uint32_t seed, double amp = 1.0);

std::string shape_str(const std::vector<I>& s);
I numel(const std::vector<I>& s);

// RoPE, the absolute encodings and the bias generators against memcpy / memset.
std::vector<Case> elementwise_cases();

// ---- attention (cases_attention.cc)

constexpr I kHeads = 8, kHeadDim = 64, kXlR = 64, kCopeNpos = 64, kT5Buckets = 32;
constexpr I kFireWidth = 32;  // the FIRE paper's MLP width

// One attention problem: causal, B = 1, Hq = Hkv = kHeads, d = kHeadDim, L queries and keys, with the
// encoding's tensors (random), and for backward dout and every gradient buffer.
struct AttnProblem {
  AttentionParams p;
  Keep mem;
  std::vector<std::vector<float>> small;  // encoding tensors and their gradients
  std::vector<std::int64_t> qpos;         // rope2d [2, L], mrope [3, L] positions (queries = keys)
  View q, k, v, out, dout, dq, dk, dv;
  View lse;                 // float64 [1, H, L]: the forward's, for the backward from saved statistics
  std::vector<double> lse_buf;
  EncodingTensors t;
  EncodingGrads g;
  double io_bytes = 0;  // inputs + outputs of the call
};

// The problem of encoding enc at length L (mixed: rope2d's mixed variant).
std::shared_ptr<AttnProblem> make_attention(Encoding enc, I L, DType dt, bool backward, int threads,
                                            bool mixed = false);
// The public forward or backward call on it.
Status run_attention(const AttnProblem& a, bool backward);
// A backward problem given the forward's out and lse (run once here), for
// attention_backward_from_stats: the backward of a training step that kept them.
std::shared_ptr<AttnProblem> make_attention_saved(Encoding enc, I L, DType dt, int threads);
// Useful FLOPs (see docs/performance.md): 4·B·H·M·N·d, halved when causal; backward 2.5×.
double attention_flops(I L, bool backward);
// The encodings the attention takes: the registry's, but for the absolute ones.
std::vector<const EncodingInfo*> attention_encodings();
// "fused" or "reference": which path a causal call of enc in dt takes; "fused+amx" or
// "fused+vdpbf16" where bfloat16 takes the tile products on bfloat16 pairs on this CPU (which ones).
std::string attention_path(Encoding enc, DType dt);
// Forward and backward per encoding at L = 1024 and 4096, against the sgemm baseline.
std::vector<Case> attention_cases();

// Decode steps against a same-run read of K and V (cases_decode.cc).
std::vector<Case> decode_cases();

}  // namespace posenc::bench_impl
