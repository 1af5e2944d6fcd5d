// The fused cope attention kernel: not written yet; the dispatcher runs the reference for cope.
#include "attention/attention_fused.h"

namespace posenc::fused {

bool cope_fused() { return false; }

Status cope_forward(const AttentionParams&, const attn::Dims&, const View&, const View&, const View&,
                  const EncodingTensors&, const View&, const View&) {
  return Status::Invalid("encoding", "cope is not fused");
}

Status cope_backward(const AttentionParams&, const attn::Dims&, const View&, const View&, const View&,
                   const EncodingTensors&, const View&, const View&, const View&, const View&,
                   const EncodingGrads&) {
  return Status::Invalid("encoding", "cope is not fused");
}

}  // namespace posenc::fused
