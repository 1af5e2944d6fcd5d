// Private: the fused (flash-style) attention kernels of attention_cpu.cc, callable directly — without
// the dispatcher's small-problem rule — so tests can hold them against posenc::reference at any size.
// Same arguments and validation as posenc::attention_forward / attention_backward; a case the kernels
// do not cover (xl, cope, float64 inputs, an output overlapping an input) returns kInvalidArgument
// naming "encoding", "q" or the output, and writes nothing.
#pragma once

#include "posenc/attention.h"

namespace posenc::fused {

// Whether the fused kernels cover this encoding and q/k/v dtype.
bool supports(const AttentionParams& p, DType qkv);

Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse = View{});

Status attention_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                          const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                          const View& dv, const EncodingGrads& g);

}  // namespace posenc::fused
