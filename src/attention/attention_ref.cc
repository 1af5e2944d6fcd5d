// PLACEHOLDER until the reference lands.
#include "posenc/attention.h"
namespace posenc {
Status attention_forward(const AttentionParams&, const View&, const View&, const View&,
                         const EncodingTensors&, const View&, const View&) {
  return Status::Internal("not implemented yet");
}
Status attention_backward(const AttentionParams&, const View&, const View&, const View&,
                          const EncodingTensors&, const View&, const View&, const View&,
                          const View&, const EncodingGrads&) {
  return Status::Internal("not implemented yet");
}
}  // namespace posenc
