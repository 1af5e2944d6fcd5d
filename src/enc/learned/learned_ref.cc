// PLACEHOLDER until the reference lands.
#include "posenc/absolute.h"
namespace posenc {
Status learned_forward(const LearnedParams&, const View&, const View&, const Positions&, const View&) {
  return Status::Internal("not implemented yet");
}
Status learned_backward(const LearnedParams&, const View&, const View&, const Positions&, const View&,
                        const View&) {
  return Status::Internal("not implemented yet");
}
}  // namespace posenc
