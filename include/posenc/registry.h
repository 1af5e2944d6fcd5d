// posenc/registry.h — the one catalogue of encodings, walked by the CLI, the tests and the benchmarks.
// Adding an encoding is a folder under src/enc plus one entry in src/core/registry.cc.
#pragma once

#include <string>
#include <vector>

#include "posenc/status.h"

namespace posenc {

enum class Encoding {
  kNope, kLearned, kSinusoidal, kRope, kAlibi, kT5, kXL, kCope,
  kKerple, kSandwich, kFire,  // the extrapolating logit biases beyond ALiBi (bias.h)
  kRope2d, kMrope, kXpos,     // the rotary encodings beyond 1D RoPE (rotary.h)
};

// Where an encoding acts.
enum class Kind {
  kNone,        // nope: the baseline
  kAbsolute,    // added to token embeddings once, before the first layer
  kRotary,      // applied to q and k inside every attention layer
  kLogitBias,   // added to scale·q·kᵀ inside attention
  kContextual,  // a bias that depends on the attention logits themselves
};

const char* kind_name(Kind k);  // "none", "absolute", "rotary", "logit_bias", "contextual"

// One parameter of an encoding, as the CLI spells it (flag --<name>).
struct ParamSpec {
  std::string name;       // "rotary-dim"
  std::string type;       // "float", "int", "bool", "choice", "ints" (comma-separated: "16,24,24"),
                          // "tensor" (.npy), "file" (another file)
  std::string default_;   // "" when required or absent by default
  std::vector<std::string> choices;  // for "choice"
  std::string help;
  bool learned = false;   // a trainable tensor (has a gradient)
};

struct EncodingInfo {
  Encoding id;
  std::string name;     // "rope"
  Kind kind;
  std::string summary;  // one line
  std::string paper;    // citation
  std::vector<ParamSpec> params;
};

// Every encoding, in the order of Encoding.
const std::vector<EncodingInfo>& registry();
// The entry named `name` ("rope"); an unknown name is an error listing the known ones.
Expected<EncodingInfo> find_encoding(const std::string& name);
// The entry of `id` (every Encoding has one).
const EncodingInfo& encoding_info(Encoding id);

}  // namespace posenc
