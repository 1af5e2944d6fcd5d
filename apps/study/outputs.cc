// study/outputs.cc — a study's files: results.json, results.csv and the picture gnuplot draws.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "study/gnuplot.h"
#include "study/run.h"
#include "study/temp_files.h"

namespace posenc {
namespace {

// The y axis of the perplexity plot: log scale with labelled tics from 1, 1.2, 1.5, 2, … × 10^k
// inside the data's range (gnuplot labels only powers of ten, none inside a range narrower than a
// decade), at most ten; a linear axis when the range is too narrow for log tics to help.
std::string ppl_axis(const std::vector<StudyResult>& rs) {
  double lo = 0, hi = 0;
  for (const StudyResult& r : rs)
    for (const EvalPoint& p : r.eval)
      if (p.ppl && *p.ppl > 0) {
        lo = lo > 0 ? std::min(lo, *p.ppl) : *p.ppl;
        hi = std::max(hi, *p.ppl);
      }
  std::string s = "set autoscale yfix\nset offsets 0, 0, graph 0.05, graph 0.05\n";
  if (lo <= 0 || hi / lo < 1.5) return s;
  static const double kMant[] = {1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8};
  std::vector<double> tics;
  for (int k = static_cast<int>(std::floor(std::log10(lo))) - 1; k <= static_cast<int>(std::ceil(std::log10(hi))); ++k)
    for (double m : kMant) {
      const double v = m * std::pow(10.0, k);
      if (v >= lo / 1.1 && v <= hi * 1.1) tics.push_back(v);
    }
  const std::size_t step = (tics.size() + 9) / 10;
  std::ostringstream o;
  o << s << "set logscale y\nset ytics (";
  for (std::size_t i = 0; i < tics.size(); i += step) o << (i ? ", " : "") << tics[i];
  o << ")\n";
  return o.str();
}

// The title's note of the seeds: the curves are means, the bars one sample sd either side.
std::string spread_title(const StudyConfig& cfg) {
  return cfg.seeds > 1 ? " (mean ± sd of " + std::to_string(cfg.seeds) + " seeds)" : std::string();
}

}  // namespace

std::vector<std::string> study_files(const StudyConfig& cfg) {
  return {"results.json", "results.csv", cfg.task ? "acc_vs_length.png" : "ppl_vs_length.png"};
}

std::string study_plot_script(const StudyRun& run, const std::string& png) {
  const StudyConfig& cfg = run.cfg;
  const std::vector<StudyResult>& rs = run.results;
  const bool acc = cfg.task.has_value();
  std::ostringstream s;
  s << "set terminal pngcairo size 960,640 enhanced font 'sans,11'\n"
    << "set output '" << png << "'\n"
    << "set logscale x\n" << (acc ? "set yrange [0:1.05]\n" : ppl_axis(rs))
    << "set xrange [" << 0.8 * cfg.train_len * cfg.eval_multiples.front() << ":"
    << 1.25 * cfg.train_len * cfg.eval_multiples.back() << "]\n"
    << "set grid\nset key outside right\n"
    << "set xlabel 'evaluation length (bytes)'\nset ylabel '" << (acc ? "accuracy" : "perplexity (per byte)") << "'\n"
    << "set title 'posenc study" << (acc ? std::string(" (") + task_name(*cfg.task) + ")" : std::string())
    << ": trained at " << cfg.train_len << ", evaluated longer"
    << (spread_title(cfg)) << "'\n"
    << "set xtics (";
  for (std::size_t i = 0; i < cfg.eval_multiples.size(); ++i)
    s << (i ? ", " : "") << "'" << cfg.eval_multiples[i] * cfg.train_len << "' " << cfg.eval_multiples[i] * cfg.train_len;
  s << ")\n";
  // Each curve's data: length, mean and (with two seeds or more) the sample sd, drawn as error bars.
  const bool spread = cfg.seeds > 1;
  for (std::size_t i = 0; i < rs.size(); ++i) {
    s << "$d" << i << " << EOD\n";
    for (const EvalPoint& p : rs[i].eval) {
      if (p.depth) continue;  // passkey's rows by depth are in the table and the files
      const std::optional<double>& v = acc ? p.acc : p.ppl;
      const std::optional<double>& sd = acc ? p.acc_sd : p.ppl_sd;
      if (v) s << p.len << " " << *v << (spread ? " " + std::to_string(sd.value_or(0.0)) : std::string()) << "\n";
    }
    s << "EOD\n";
  }
  // One colour, point type and dash per curve: 14 encodings outrun gnuplot's 8 default colours.
  static const char* const kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                         "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#f5b700",
                                         "#0b3d91", "#a6d854"};
  static const int kPoints[] = {7, 5, 9, 11, 13, 15};
  constexpr std::size_t kNc = sizeof kColours / sizeof kColours[0], kNp = sizeof kPoints / sizeof kPoints[0];
  s << "plot ";
  for (std::size_t i = 0; i < rs.size(); ++i)
    s << (i ? ", " : "") << "$d" << i << (spread ? " using 1:2:3 with yerrorlines" : " using 1:2 with linespoints")
      << " lw 2 lc rgb '" << kColours[i % kNc] << "' pt " << kPoints[i % kNp] << " dt " << (1 + (i / kNc) % 4)
      << " title '" << rs[i].name << "'";
  s << "\n";
  return s.str();
}

Status write_study(const std::string& out, const StudyRun& run) {
  // The directory, if new, is made now; it is removed again when nothing could be written into it.
  struct stat sb;
  const bool made = stat(out.c_str(), &sb) != 0;
  if (made && mkdir(out.c_str(), 0777) != 0)
    return Status::Io("out", "cannot create directory " + out + ": " + std::strerror(errno));
  const std::string dir = out + "/";
  const std::vector<std::string> files = study_files(run.cfg);
  // Each file is written to its temporary (study/temp_files.h), then all are renamed into place.
  std::vector<std::string> tmp;
  for (const std::string& f : files) {
    files::remove_stale_temps(dir + f);
    tmp.push_back(files::temp_path(dir + f));
  }
  files::remove_stale_temps(dir + "plot.gp");
  const auto give_up = [&](const std::string& what, std::size_t from) {
    for (std::size_t k = from; k < files.size(); ++k) std::remove(tmp[k].c_str());
    if (made && from == 0) rmdir(out.c_str());
    return Status::Io("out", what);
  };
  const std::pair<std::size_t, std::string> texts[] = {{0, results_json(run)}, {1, results_csv(run)}};
  for (const auto& [i, text] : texts)
    if (!write_file(tmp[i], text)) return give_up("cannot write " + dir + files[i] + ": " + std::strerror(errno), 0);
  GnuplotJob job;
  job.png = tmp[2];
  job.script = study_plot_script(run, job.png);
  job.script_path = files::temp_path(dir + "plot.gp");
  job.arg = "out";
  job.missing = "the plot needs gnuplot (apt-get install gnuplot-nox)";
  job.script_failed = "cannot write " + dir + "plot.gp";
  job.draw_failed = "gnuplot failed to draw the plot";
  job.incomplete = "gnuplot could not write the whole of " + dir + files[2] + " (is the disk full?)";
  if (Expected<std::string> png = draw_png(job); !png.ok()) return give_up(png.status().what(), 0);
  for (std::size_t i = 0; i < files.size(); ++i)
    if (std::rename(tmp[i].c_str(), (dir + files[i]).c_str()) != 0)
      return give_up("cannot write " + dir + files[i] + ": " + std::strerror(errno), i);
  return Status::Ok();
}

}  // namespace posenc
