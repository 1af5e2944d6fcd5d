// The buffers and baselines shared by the cases of `posenc bench` (bench_cases.h).
#include <omp.h>

#include <chrono>
#include <cstring>

#include "bench/bench_cases.h"
#include "core/fast_common.h"

namespace posenc::bench_impl {

using Clock = std::chrono::steady_clock;

double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

Mem::Mem(std::size_t n, int threads, unsigned char fill) : bytes(n) {
  p.reset(static_cast<unsigned char*>(std::aligned_alloc(64, (n + 63) / 64 * 64)));
  const I chunks = 64;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (I c = 0; c < chunks; ++c) {
    const std::size_t a = n * ix(c) / chunks, b = n * ix(c + 1) / chunks;
    std::memset(p.get() + a, fill, b - a);
  }
}

// Baselines, split over threads like the kernels.
void par_memcpy(void* dst, const void* src, std::size_t n, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const std::size_t t = ix(omp_get_thread_num()), T = ix(omp_get_num_threads());
    const std::size_t a = n * t / T / 64 * 64, b = t + 1 == T ? n : n * (t + 1) / T / 64 * 64;
    std::memcpy(static_cast<char*>(dst) + a, static_cast<const char*>(src) + a, b - a);
  }
}
void par_memset(void* dst, std::size_t n, int threads) {
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const std::size_t t = ix(omp_get_thread_num()), T = ix(omp_get_num_threads());
    const std::size_t a = n * t / T / 64 * 64, b = t + 1 == T ? n : n * (t + 1) / T / 64 * 64;
    std::memset(static_cast<char*>(dst) + a, 0, b - a);
  }
}

// The threads a baseline splits over: those of the kernel, which stays on the calling thread below
// fast::kParallelMin elements (a decode step; an OpenMP region would cost more than the copy).
int baseline_threads(I elements, int threads) { return elements < fast::kParallelMin ? 1 : threads; }

// The memcpy baseline of an elementwise kernel that moves `bytes` (read + written): a copy of half
// of them between two buffers of its own, so that it too reads and writes `bytes` in all.
std::function<void()> memcpy_baseline(double bytes, int threads, Keep* keep) {
  const std::size_t half = static_cast<std::size_t>(bytes / 2);
  auto src = std::make_shared<Mem>(half, threads, 1), dst = std::make_shared<Mem>(half, threads);
  keep->push_back(src);
  keep->push_back(dst);
  return [=] { par_memcpy(dst->data(), src->data(), half, threads); };
}

// Only a strided sample is randomised (setting every element through View would dominate the run
// for the elementwise cases, whose speed does not depend on the values).
void fill_random(void* p, std::size_t n_elems, DType dt) {
  const View v = View::contiguous(p, dt, {static_cast<I>(n_elems)});
  std::uint32_t s = 12345;
  for (std::size_t i = 0; i < n_elems; i += 61) {
    s = s * 1664525u + 1013904223u;
    v.set(static_cast<I>(i), (static_cast<double>(s >> 8) / 16777216.0) - 0.5);
  }
}

// Every element uniform in [−amp, amp) (attention inputs: the softmax and CoPE's gates see real data).
void fill_all(const View& v, std::uint32_t seed, double amp) {
  const I n = v.numel();
  std::uint32_t s = seed * 2654435761u + 1u;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return amp * (2.0 * (static_cast<double>(s >> 8) / 16777216.0) - 1.0);
  };
  if (v.dtype == DType::kF32 && v.is_contiguous()) {
    float* p = static_cast<float*>(v.data);
    for (I i = 0; i < n; ++i) p[i] = static_cast<float>(next());
  } else {
    for (I i = 0; i < n; ++i) v.set(i, next());
  }
}

std::string shape_str(const std::vector<I>& s) {
  return View::contiguous(nullptr, DType::kF32, s).shape_str();
}

I numel(const std::vector<I>& s) {
  I n = 1;
  for (I e : s) n *= e;
  return n;
}

}  // namespace posenc::bench_impl
