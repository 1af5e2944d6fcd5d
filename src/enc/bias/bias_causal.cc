// The causal mask of the logit biases (bias_geometry.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/fast_common.h"
#include "enc/bias/bias_geometry.h"

namespace posenc::bias {

void mask_causal(const BiasGeometry& g, const View& out) {
  if (!g.causal) return;
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const std::size_t es = dtype_size(out.dtype);
  unsigned char neg_inf[8];  // −inf in out's dtype
  const double d = -std::numeric_limits<double>::infinity();
  const float f = -std::numeric_limits<float>::infinity();
  const std::uint16_t bf16 = 0xff80u, f16 = 0xfc00u;
  std::memcpy(neg_inf,
              out.dtype == DType::kF64    ? static_cast<const void*>(&d)
              : out.dtype == DType::kF32  ? static_cast<const void*>(&f)
              : out.dtype == DType::kBF16 ? static_cast<const void*>(&bf16)
                                          : static_cast<const void*>(&f16),
              es);
  const std::int64_t q0 = g.query_offset();
  const int threads = fast::threads_for(H * M * N);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (std::int64_t t = 0; t < H * M; ++t) {
    const std::int64_t h = t / M, i = t % M;
    // masked: k_offset + j > q0 + i, i.e. j ≥ q0 + i − k_offset + 1 (g checked: no overflow)
    const std::int64_t first = std::max<std::int64_t>(0, std::min<std::int64_t>(N, q0 + i - g.k_offset + 1));
    char* row = static_cast<char*>(out.data) +
                (h * out.strides[0] + i * out.strides[1]) * static_cast<std::int64_t>(es);
    for (std::int64_t j = first; j < N; ++j)
      std::memcpy(row + j * out.strides[2] * static_cast<std::int64_t>(es), neg_inf, es);
  }
}

}  // namespace posenc::bias
