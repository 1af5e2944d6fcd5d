// python/csrc/bridge.h — what the extension needs of the C++ API beyond the C ABI (the registry, the
// thread count, sinusoidal PE, logit biases, a config's frequencies), behind an interface that
// compiles as C++17 without the library's headers (torch 1.13's headers are C++17, posenc's C++20).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "posenc/c_api.h"

namespace posenc_py {

// The outcome of a call: code 0 (POSENC_OK) or a POSENC_ERR_* code with the library's one-line message.
struct Result {
  int code = POSENC_OK;
  std::string message;
};

struct ParamInfo {
  std::string name;  // as the CLI spells it, less the dashes ("rotary-dim")
  std::string type;  // "float", "int", "bool", "choice", "ints", "tensor", "file"
  std::string default_value;
  std::vector<std::string> choices;
  std::string help;
  bool learned = false;
};

struct EncodingEntry {
  std::string name, kind, summary, paper;
  std::vector<ParamInfo> params;
};

std::vector<EncodingEntry> registry();
int num_threads();
void set_num_threads(int n);

// y = x + PE (backward: dx = dy) for x, y [B, L, D]; positions may be NULL (offset + l).
Result sinusoidal(double base, const posenc_tensor& x, const posenc_tensor* positions, std::int64_t offset,
                  const posenc_tensor& y, bool backward);

// Named tensors of an encoding (the registry's names, '_' for '-').
using TensorMap = std::map<std::string, posenc_tensor>;

// A bias call: the encoding, its keys (text, the C ABI's vocabulary) and tensors, and the geometry.
struct BiasCall {
  std::string encoding;
  std::map<std::string, std::string> params;
  TensorMap tensors;
  std::int64_t heads = 1, q_len = 1, k_len = 1, q_offset = 0, k_offset = 0;
  bool causal = false;  // BiasGeometry::causal
};

// The dtype the bias takes (that of weights, slopes, r1 or mlp_w2; float64 otherwise), or an error
// for an encoding without a position-only bias.
Result bias_dtype(const BiasCall& c, int* dtype);
// out [H, M, N] = the encoding's logit bias.
Result bias_forward(const BiasCall& c, const posenc_tensor& out);
// The gradients of the learned tensors named in grads (each shaped like its tensor) given dbias.
Result bias_backward(const BiasCall& c, const posenc_tensor& dbias, const TensorMap& grads);

// A Hugging Face config.json's RoPE as `posenc rope-config` prints it: a JSON object in *json.
Result rope_config_json(const std::string& config_text, std::int64_t seq_len, std::string* json);

}  // namespace posenc_py
