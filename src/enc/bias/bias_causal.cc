// The causal mask of the logit biases (bias_geometry.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/fast_common.h"
#include "enc/bias/bias_geometry.h"

namespace posenc::bias {

namespace {

// The byte offset of element (h, i, j) of v.
std::int64_t offset(const View& v, std::int64_t h, std::int64_t i, std::int64_t j) {
  return (h * v.strides[0] + i * v.strides[1] + j * v.strides[2]) * static_cast<std::int64_t>(dtype_size(v.dtype));
}

}  // namespace

void set_masked(const BiasGeometry& g, const View& v, const void* value) {
  if (!g.causal) return;
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len, q0 = g.query_offset();
  const std::size_t es = dtype_size(v.dtype);
  const int threads = fast::threads_for(H * M * N);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (std::int64_t t = 0; t < H * M; ++t) {
    const std::int64_t h = t / M, i = t % M;
    // masked: k_offset + j > q0 + i, i.e. j ≥ q0 + i − k_offset + 1 (g checked: no overflow)
    const std::int64_t first = std::clamp<std::int64_t>(q0 + i - g.k_offset + 1, 0, N);
    char* base = static_cast<char*>(v.data);
    for (std::int64_t j = first; j < N; ++j) std::memcpy(base + offset(v, h, i, j), value, es);
  }
}

void mask_causal(const BiasGeometry& g, const View& out) {
  const double d = -std::numeric_limits<double>::infinity();
  const float f = -std::numeric_limits<float>::infinity();
  const std::uint16_t bf16 = 0xff80u, f16 = 0xfc00u;
  set_masked(g, out,
             out.dtype == DType::kF64    ? static_cast<const void*>(&d)
             : out.dtype == DType::kF32  ? static_cast<const void*>(&f)
             : out.dtype == DType::kBF16 ? static_cast<const void*>(&bf16)
                                         : static_cast<const void*>(&f16));
}

View masked_copy(const BiasGeometry& g, const View& dbias, std::vector<unsigned char>* bytes) {
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const std::size_t es = dtype_size(dbias.dtype);
  bytes->resize(static_cast<std::size_t>(H * M * N) * es);
  const View copy = View::contiguous(bytes->data(), dbias.dtype, {H, M, N});
  const char* src = static_cast<const char*>(dbias.data);
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j)
        std::memcpy(static_cast<char*>(copy.data) + offset(copy, h, i, j), src + offset(dbias, h, i, j), es);
  const unsigned char zero[8] = {};  // +0 in every float dtype
  set_masked(g, copy, zero);
  return copy;
}

}  // namespace posenc::bias
