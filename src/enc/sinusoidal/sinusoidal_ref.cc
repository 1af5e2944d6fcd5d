// PLACEHOLDER until the reference lands.
#include "posenc/absolute.h"
namespace posenc {
Status sinusoidal_table(const SinusoidalParams&, const Positions&, const View&) {
  return Status::Internal("not implemented yet");
}
Status sinusoidal_forward(const SinusoidalParams&, const View&, const Positions&, const View&) {
  return Status::Internal("not implemented yet");
}
Status sinusoidal_backward(const SinusoidalParams&, const View&, const Positions&, const View&) {
  return Status::Internal("not implemented yet");
}
}  // namespace posenc
