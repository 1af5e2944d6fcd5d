// PLACEHOLDER until the reference lands.
#include "posenc/bias.h"
#include "enc/t5/t5_math.h"
namespace posenc {
Status t5_validate(const T5Params&) {
  return Status::Internal("not implemented yet");
}
std::int64_t t5_bucket(std::int64_t r, const T5Params& p) { return t5::bucket(r, p.bidirectional, p.num_buckets, p.max_distance); }
Status t5_bias(const T5Params&, const BiasGeometry&, const View&, const View&) {
  return Status::Internal("not implemented yet");
}
Status t5_bias_backward(const T5Params&, const BiasGeometry&, const View&, const View&) {
  return Status::Internal("not implemented yet");
}
}  // namespace posenc
