// cli/output_set.h — the posenc command's outputs, written all-or-nothing.
//
// OutputSet writes every output to a temporary file beside its destination (the target of a
// symbolic link), then renames them all into place; on any failure it removes its temporaries, puts
// back any file it had displaced, and leaves no new output behind. A destination that exists and is
// not a regular file (/dev/null, a FIFO) is written in place. No output may replace a file this run
// read (inputs_read()).
#pragma once

#include <string>
#include <vector>

#include "cli/npy.h"
#include "posenc/status.h"

namespace posenc::cli {

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
