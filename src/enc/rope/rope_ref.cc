// PLACEHOLDER until the reference lands.
#include "posenc/rope.h"
namespace posenc {
const char* rope_layout_name(RopeLayout l) { return l == RopeLayout::kHalf ? "half" : "interleaved"; }
Expected<RopeLayout> parse_rope_layout(const std::string& s) {
  if (s == "interleaved") return RopeLayout::kInterleaved;
  if (s == "half") return RopeLayout::kHalf;
  return Status::Invalid("layout", "expected interleaved or half, got '" + s + "'");
}
Status rope_forward(const RopeParams&, const View&, const Positions&, const View&) {
  return Status::Internal("not implemented yet");
}
Status rope_backward(const RopeParams&, const View&, const Positions&, const View&) {
  return Status::Internal("not implemented yet");
}
}  // namespace posenc
