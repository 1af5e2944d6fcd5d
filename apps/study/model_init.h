// The study model's initial weights (model_init.cc): GPT-2's scheme, with the rules of each position
// encoding's own tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "study/model.h"

namespace posenc {

// The n initial weights of a model of config c (n ≥ every layout entry's offset + size; entries of
// no layout slot 0), drawn from one N(0, 1) stream seeded with seed in layout order: the same
// numbers for the float and the double model.
std::vector<double> initial_weights(const ModelConfig& c, const std::vector<ParamInfo>& layout, std::size_t n,
                                    std::uint64_t seed);

}  // namespace posenc
