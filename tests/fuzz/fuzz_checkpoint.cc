// Fuzz target: the safetensors checkpoints of posenc train (study/model.h: checkpoint_from_bytes,
// which load_checkpoint runs on a file): header length, the JSON header, __metadata__'s
// posenc.config, each tensor's dtype, shape and data_offsets. A checkpoint it accepts is written back
// (checkpoint_bytes) and read again: the same parameters.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "study/model.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  posenc::Expected<posenc::Checkpoint> ck = posenc::checkpoint_from_bytes(bytes, "fuzz.safetensors");
  if (!ck.ok()) return 0;
  posenc::Expected<std::string> out = posenc::checkpoint_bytes(ck.value().config, ck.value().params);
  if (!out.ok()) std::abort();  // a checkpoint that was read cannot be written back
  posenc::Expected<posenc::Checkpoint> again = posenc::checkpoint_from_bytes(out.value(), "again.safetensors");
  if (!again.ok()) std::abort();
  const std::vector<float>& a = again.value().params;  // compared as bytes: a NaN stays the same NaN
  if (a.size() != ck.value().params.size() ||
      std::memcmp(a.data(), ck.value().params.data(), a.size() * sizeof(float)) != 0)
    std::abort();
  return 0;
}
