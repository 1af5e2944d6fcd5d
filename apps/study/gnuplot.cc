// study/gnuplot.cc — gnuplot found, run on a script, its picture read back and checked.
#include "study/gnuplot.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "study/results.h"

namespace posenc {
namespace {

// A path as one shell word.
std::string shell_quoted(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

}  // namespace

bool gnuplot_found() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

bool is_whole_png(const std::string& b) {
  static const char kSignature[] = "\x89PNG\r\n\x1a\n";
  return b.size() >= 20 && b.compare(0, 8, kSignature, 8) == 0 && b.compare(b.size() - 8, 4, "IEND") == 0;
}

Expected<std::string> draw_png(const GnuplotJob& job) {
  if (!gnuplot_found()) return Status::Io(job.arg, job.missing);
  if (!write_file(job.script_path, job.script)) {
    const int e = errno;
    std::remove(job.script_path.c_str());
    return Status::Io(job.arg, job.script_failed + ": " + std::strerror(e));
  }
  const int rc = std::system(("gnuplot " + shell_quoted(job.script_path) + " 2>/dev/null").c_str());
  std::remove(job.script_path.c_str());
  if (rc != 0) return Status::Io(job.arg, job.draw_failed);
  std::ifstream f(job.png, std::ios::binary);
  std::string png((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!is_whole_png(png)) return Status::Io(job.arg, job.incomplete);
  return png;
}

}  // namespace posenc
