// The fused xl attention kernel: not written yet; the dispatcher runs the reference for xl.
#include "attention/attention_fused.h"

namespace posenc::fused {

bool xl_fused() { return false; }

Status xl_forward(const AttentionParams&, const attn::Dims&, const View&, const View&, const View&,
                  const EncodingTensors&, const View&, const View&) {
  return Status::Invalid("encoding", "xl is not fused");
}

Status xl_backward(const AttentionParams&, const attn::Dims&, const View&, const View&, const View&,
                   const EncodingTensors&, const View&, const View&, const View&, const View&,
                   const EncodingGrads&) {
  return Status::Invalid("encoding", "xl is not fused");
}

}  // namespace posenc::fused
