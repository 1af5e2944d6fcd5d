// study/gnuplot.h — the one place that runs gnuplot: the study's plot and `posenc plot` both draw
// through draw_png, which checks for gnuplot, writes the script, runs it and checks the picture.
#pragma once

#include <string>

#include "posenc/status.h"

namespace posenc {

// True when `gnuplot` is on the PATH.
bool gnuplot_found();

// True when bytes hold a PNG through to its IEND chunk (gnuplot exits 0 even when a full disk cut its
// picture short).
bool is_whole_png(const std::string& bytes);

// One picture: a gnuplot script that draws into `png`, and the texts of its errors, each a
// Status::Io naming `arg`.
struct GnuplotJob {
  std::string script;       // sets its own terminal and output (`png`)
  std::string script_path;  // where the script is written; removed after the run
  std::string png;          // the file the script draws
  std::string arg = "out";
  std::string missing;        // gnuplot is not installed: "plots need gnuplot (apt-get install …)"
  std::string script_failed;  // the script could not be written: "cannot write X" (+ ": " strerror)
  std::string draw_failed;    // gnuplot exited non-zero: "gnuplot failed to draw X"
  std::string incomplete;     // the picture is cut short: "gnuplot could not write the whole of X"
};

// Checks for gnuplot, writes job.script to job.script_path, runs gnuplot on it (its stderr
// discarded), removes the script and reads `png` back: the picture's bytes, or the error. The picture
// file is left where it is either way (the caller moves or removes it).
Expected<std::string> draw_png(const GnuplotJob& job);

}  // namespace posenc
