// study/progress.cc — the study's progress line.
#include "study/progress.h"

#include <unistd.h>

#include <algorithm>

namespace posenc {

std::string format_seconds(double s) {
  char buf[32];
  if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%.0fs", s);
  return buf;
}

ProgressBar::ProgressBar(std::FILE* sink, std::vector<std::string> names, std::int64_t steps)
    : sink_(sink), names_(std::move(names)), steps_(steps), done_(names_.size(), 0),
      t0_(std::chrono::steady_clock::now()), tty_(isatty(fileno(sink))) {}

void ProgressBar::update(std::size_t enc, std::int64_t step, double loss) {
  const std::int64_t before = done_[enc];
  done_[enc] = std::min(step, steps_ + 1);
  const double total = double(names_.size()) * double(steps_ + 1);
  double done = 0;
  std::string active;
  for (std::size_t e = 0; e < done_.size(); ++e) {
    done += double(done_[e]);
    if (done_[e] > 0 && done_[e] <= steps_) active += (active.empty() ? "" : ",") + names_[e];
  }
  if (active.empty()) active = names_[enc];
  const double el = elapsed();
  // Not a terminal: a line when an encoding passes a quarter of its steps or starts evaluating.
  const std::int64_t q = std::max<std::int64_t>(1, steps_ / 4);
  if (tty_ ? (el - last_ < 0.2 && step <= steps_) : (step / q == before / q && step <= steps_)) return;
  if (!tty_ && step > steps_ && before > steps_) return;
  last_ = el;
  const int width = 30, fill = int(width * done / total);
  const double eta = done > 0 ? el * (total - done) / done : 0;
  std::string bar(std::size_t(fill), '#');
  bar.resize(width, '.');
  std::fprintf(sink_, "%s[%s] %-22s %s  loss %.3f  elapsed %s  ETA %s   %s", tty_ ? "\r" : "", bar.c_str(),
               active.c_str(),
               step <= steps_ ? ("step " + std::to_string(step) + "/" + std::to_string(steps_)).c_str()
                              : "evaluating",
               loss, format_seconds(el).c_str(), format_seconds(eta).c_str(), tty_ ? "" : "\n");
  std::fflush(sink_);
}

void ProgressBar::finish() {
  if (tty_) std::fprintf(sink_, "\n");
}

double ProgressBar::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

}  // namespace posenc
