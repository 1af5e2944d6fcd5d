// cli/npy.h — NumPy .npy files in and out of the posenc command.
//
// Reads format versions 1.0, 2.0 and 3.0 with dtypes float32, float64, int32, int64 (and float16,
// the library's DType::kF16 storage), little-endian ('<', or '|' / '=' on this little-endian host),
// C order, up to kMaxDims dimensions.
// Writes version 1.0 (2.0 only if a header ever outgrew 64 KiB), header padded to 64 bytes as NumPy
// does. Every error is a Status whose arg is the command-line flag the file came from ("--q").
//
// Outputs: cli/output_set.h.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "posenc/status.h"
#include "posenc/view.h"

namespace posenc::cli {

// An owning, contiguous, C-order tensor.
class Tensor {
 public:
  Tensor() = default;
  // Zero-filled. Extents must be ≥ 0 (callers validate sizes first).
  Tensor(DType dtype, std::vector<std::int64_t> shape);

  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  // A view of the whole tensor (always present, even with zero elements).
  View view() const { return View::contiguous(storage_.data(), dtype_, shape_); }
  std::string shape_str() const { return view().shape_str(); }

 private:
  DType dtype_ = DType::kF64;
  std::vector<std::int64_t> shape_;
  std::vector<std::uint64_t> storage_;  // 8-byte aligned; never empty, so data() is never null
};

// The .npy descr for a dtype ("<f4", "<f8", "<f2", "<i4", "<i8"); null for bfloat16 (NumPy has none).
const char* npy_descr(DType t);

// Reads `path`; `flag` names the command-line flag in every error.
Expected<Tensor> read_npy(const std::string& path, const std::string& flag);
// Reads .npy content of `size` bytes from `in` (positioned at its start); `name` stands for the
// source in messages (read_npy passes the path). Refuses every malformed, truncated or oversized
// input with a Status and allocates no more than the data present.
Expected<Tensor> read_npy_stream(std::istream& in, std::int64_t size, const std::string& name,
                                 const std::string& flag);

// Serialises a tensor to .npy bytes (header + data).
std::string npy_bytes(const Tensor& t);

// Records that this run reads path (a regular file) under flag, so that no output replaces it.
void note_input(const std::string& path, const std::string& flag);

// The regular files read in this run (read_npy, note_input), as (flag, canonical path), in read order.
const std::vector<std::pair<std::string, std::string>>& inputs_read();

// A path in single quotes for a one-line message (line breaks shown as spaces).
std::string quoted(const std::string& path);

}  // namespace posenc::cli
