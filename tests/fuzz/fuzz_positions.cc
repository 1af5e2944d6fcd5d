// Fuzz target: positions read from a .npy file (the command's --positions, --q-positions,
// --k-positions: read_npy_stream, then int32/int64 only) handed to the library's rotary encodings over
// a small x [B, L, 1, D] whose shape the first bytes choose. The positions' shape, dtype and values
// (negative, beyond 2^53, the offset's overflow) must be refused with a Status, never read outside
// their buffer, which is copied into an allocation of exactly the tensor's bytes.
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string>

#include "cli/npy.h"
#include "fuzz_input.h"
#include "posenc/posenc.h"
#include "posenc/threads.h"

namespace {

using namespace posenc;

constexpr std::int64_t kOffsets[] = {0, 1, -1, 7, std::int64_t{1} << 53, -(std::int64_t{1} << 53),
                                     std::numeric_limits<std::int64_t>::max(),
                                     std::numeric_limits<std::int64_t>::min()};
constexpr DType kXTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::FuzzInput in(data, size);
  const unsigned op = in.below(8);
  const std::int64_t B = 1 + in.below(2), L = 1 + in.below(6), D = 2 * (1 + in.below(4));
  const DType xt = kXTypes[in.below(4)];
  const std::int64_t offset = kOffsets[in.below(8)];
  const std::string npy = in.rest();
  std::istringstream file(npy);
  Expected<cli::Tensor> t = cli::read_npy_stream(file, static_cast<std::int64_t>(npy.size()), "pos.npy", "--positions");
  if (!t.ok() || !is_int(t.value().dtype())) return 0;  // the command's read_positions stops here
  const cli::Tensor& ids = t.value();
  // exactly the tensor's bytes, so that a read past them is reported
  std::unique_ptr<char[]> exact(new char[ids.nbytes()]);
  if (ids.nbytes() > 0) std::memcpy(exact.get(), ids.data(), ids.nbytes());
  const Positions pos{View::contiguous(exact.get(), ids.dtype(), ids.shape()), offset};

  const std::size_t x_bytes = static_cast<std::size_t>(B * L * D) * dtype_size(xt);  // exact, as ids
  std::unique_ptr<char[]> xs(new char[x_bytes]()), ys(new char[x_bytes]());
  const View x = View::contiguous(xs.get(), xt, {B, L, 1, D});
  const View y = View::contiguous(ys.get(), xt, {B, L, 1, D});
  switch (op) {
    case 0:
      (void)expand_positions("positions", pos, B, L);
      break;
    case 1:
      (void)expand_positions_axes("positions", pos, 3, B, L);
      break;
    case 2:
      (void)rope_forward(RopeParams{}, x, pos, y);
      break;
    case 3:
      (void)rope_backward(RopeParams{.rope_type = RopeType::kDynamic, .factor = 2.0, .original_max_position = 4},
                          x, pos, y);
      break;
    case 4: {
      MropeParams p;
      p.mrope_section = {D / 2, 0, 0};
      (void)mrope_forward(p, x, pos, y);
      break;
    }
    case 5:
      (void)xpos_forward(XposParams{}, XposRole::kKey, x, pos, y);
      break;
    case 6:
      (void)rope2d_forward(Rope2dParams{}, x, pos, View{}, y);
      break;
    default:
      (void)rope_apply_qk(RopeParams{.layout = RopeLayout::kInterleaved}, x, x, pos, y, y);
      break;
  }
  return 0;
}
