// Private: xl's key sinusoids in the decode kernel (attention_decode_task.cc). A task's keys are cut
// into windows of nt keys, [j0 + k·nt, j0 + (k + 1)·nt); for a window starting at t0,
// Ỹ·s(t0 + m) = Ỹ'·s(m), where Ỹ' turns each (sin, cos) pair of Ỹ by t0·ω (angle addition). So the
// sinusoid table s(m), m < nt, is formed once per task, and a window turns the query rows instead.
#pragma once

#include <cstdint>
#include <vector>

namespace posenc::decode_impl {

class XlWindows {
 public:
  // X: the sinusoid's dimension (even); windows of nt keys from key j0; base: the sinusoid's.
  XlWindows(std::int64_t X, std::int64_t nt, std::int64_t j0, double base);
  // Moves to window k, k at least the current window (0 at first).
  void seek(std::int64_t k);
  // out [X, n] = yt [X, n] (columns: rows Ỹ; (sin, cos) pairs in rows 2f, 2f + 1) turned by the
  // current window's angles t0·ω_f.
  void turn(const float* yt, std::int64_t n, float* out) const;

 private:
  std::int64_t k_ = 0;
  std::vector<double> cn_, sn_;  // cos, sin(nt·ω_f)
  std::vector<double> c_, s_;    // cos, sin(t0·ω_f) of the current window, stepped in double
};

}  // namespace posenc::decode_impl
