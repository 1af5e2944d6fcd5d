// Fuzz target: the posenc command's .npy reader (cli/npy.h: read_npy_stream, which read_npy runs on a
// file): magic, version, header length, the header's dict (descr, fortran_order, shape), truncation,
// huge shapes. A file it accepts is written back (npy_bytes) and read again: same dtype, shape, bytes.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "cli/cli_common.h"
#include "cli/npy.h"

using posenc::cli::Tensor;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  posenc::Expected<Tensor> t = posenc::cli::read_npy_stream(in, static_cast<std::int64_t>(size), "fuzz.npy", "--in");
  if (!t.ok()) {  // the message may quote the file's bytes; the line the command prints has no break
    const std::string line = posenc::cli::one_line(t.status().message());
    if (line.find_first_of(std::string("\n\r\0", 3)) != std::string::npos) std::abort();
    return 0;
  }
  const Tensor& x = t.value();
  const posenc::View v = x.view();  // what every command takes next
  if (v.ndim != x.ndim()) std::abort();
  (void)x.shape_str();
  const std::string bytes = posenc::cli::npy_bytes(x);
  std::istringstream again_in(bytes);
  posenc::Expected<Tensor> again =
      posenc::cli::read_npy_stream(again_in, static_cast<std::int64_t>(bytes.size()), "again.npy", "--in");
  if (!again.ok() || again.value().dtype() != x.dtype() || again.value().shape() != x.shape() ||
      std::memcmp(again.value().data(), x.data(), x.nbytes()) != 0)
    std::abort();  // the writer and the reader disagree
  return 0;
}
