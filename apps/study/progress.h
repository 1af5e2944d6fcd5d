// study/progress.h — the study's progress as one line redrawn in place: a bar over all steps of all
// encodings (several training at once), the encodings in progress, the last loss and an ETA.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace posenc {

class ProgressBar {
 public:
  // Draws on `sink` (a terminal: redrawn in place at most five times a second; anything else: a line
  // whenever an encoding passes a quarter of its steps or starts evaluating).
  ProgressBar(std::FILE* sink, std::vector<std::string> names, std::int64_t steps);
  // Encoding `enc` has done `step` steps (steps + 1: evaluating); `loss` is its last.
  void update(std::size_t enc, std::int64_t step, double loss);
  // Ends the line on a terminal.
  void finish();
  double elapsed() const;

 private:
  std::FILE* sink_;
  std::vector<std::string> names_;
  std::int64_t steps_;
  std::vector<std::int64_t> done_;
  std::chrono::steady_clock::time_point t0_;
  bool tty_;
  double last_ = -1;
};

// "42s", or "3m07s" from a minute on.
std::string format_seconds(double s);

}  // namespace posenc
