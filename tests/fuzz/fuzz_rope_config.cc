// Fuzz target: posenc::rope_config_from_json (rope.h) on arbitrary text, as the CLI's --config, the C
// ABI's posenc_rope_params_from_config and the Python package read a Hugging Face config.json. A
// config it accepts goes on to rope_frequencies, which validates the parameters for the head dim.
#include <cstdint>
#include <string>

#include "posenc/rope.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  posenc::Expected<posenc::RopeModelConfig> c = posenc::rope_config_from_json(text);
  if (!c.ok()) return 0;
  const std::int64_t d = c.value().head_dim;
  if (d > 0 && d <= 4096) {  // the frequencies of a short call and of a long one
    (void)posenc::rope_frequencies(c.value().params, d, 16);
    (void)posenc::rope_frequencies(c.value().params, d, std::int64_t{1} << 20);
  }
  return 0;
}
