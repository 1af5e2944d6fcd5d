// cli/npy.h — NumPy .npy files in and out of the posenc command.
//
// Reads format versions 1.0, 2.0 and 3.0 with dtypes float32, float64, int32, int64 (and float16,
// the library's DType::kF16 storage), little-endian ('<', or '|' / '=' on this little-endian host),
// C order, up to kMaxDims dimensions.
// Writes version 1.0 (2.0 only if a header ever outgrew 64 KiB), header padded to 64 bytes as NumPy
// does. Every error is a Status whose arg is the command-line flag the file came from ("--q").
//
// Outputs are written all-or-nothing: OutputSet writes every tensor to a temporary file beside its
// destination (the target of a symbolic link), then renames them all into place; on any failure it
// removes its temporaries, puts back any file it had displaced, and leaves no new output behind.
// A destination that exists and is not a regular file (/dev/null, a FIFO) is written in place.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
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

// 0 when a file can be created in directory dir, else the errno of the failed attempt: a probe file
// of this process is created and removed (as root, access() says yes where creating then fails, as
// under /proc).
int probe_dir_errno(const std::string& dir);

// Writes one file via a temporary beside it and a rename.
Status write_npy(const std::string& path, const Tensor& t, const std::string& flag);

// A set of outputs written all-or-nothing.
class OutputSet {
 public:
  // Checks the destination before any work is done: a distinct path (two flags naming the same file
  // is an error), an existing writable directory, not itself a directory. A symbolic link is followed:
  // the file it names is what gets replaced. An existing destination that is not a regular file (a
  // device such as /dev/null, a FIFO) is written in place instead, since a rename would replace the
  // node itself; it must be writable.
  Status reserve(const std::string& flag, const std::string& path);
  // Attaches the tensor to write for a reserved flag (the tensor must outlive commit()).
  void attach(const std::string& flag, const Tensor* t);
  // Attaches ready bytes (a PNG, a checkpoint) to write for a reserved flag.
  void attach_bytes(const std::string& flag, std::string bytes);
  // Writes every attached output: all temporaries first, then the in-place writes, then the renames;
  // on failure, nothing new is left (what was already written into a device cannot be taken back).
  Status commit();

 private:
  struct Entry {
    std::string flag, path, key;  // key: the absolute path with links resolved (the file written)
    bool in_place = false;        // an existing non-regular file: written directly
    const Tensor* tensor = nullptr;
    std::string bytes;
    bool has_bytes = false;
  };
  std::vector<Entry> entries_;
};

}  // namespace posenc::cli
