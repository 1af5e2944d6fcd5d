// posenc plot WHAT --out F.png — the pictures the articles draw, computed by posenc and drawn by
// gnuplot (pngcairo), data inline in the script:
//   sinusoid-matrix  the sinusoidal table as a heat map (as “三角函数式位置编码”
//                    plots it, docs/articles.md: 100 positions × 512 dims, n = 10000)
//   sine-waves       sin(k / n^(2x/d)) over x for positions k = 0, 4, 8, 12 (that article's four panels)
//   rope-decay       RoFormer's long-term decay (Su et al. 2021, §3.4.3, Fig. 2): the bound
//                    (1/(d/2))·Σ_j |Σ_{i<j} e^{i·Δ·θ_i}| against the relative distance Δ
//   alibi-bias       ALiBi's bias −m_h·(i − j) per head for a causal L × L window (Press et al. 2022)
//   t5-buckets       T5's bucket of each relative position, bidirectional and unidirectional
//   cope-positions   CoPE's contextual positions p_j, seen from the last byte of a sentence, when the
//                    gate opens on spaces (a query that counts words) against the plain token count
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <complex>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <utility>
#include <sstream>

#include "cli/cli_common.h"
#include "study/gnuplot.h"
#include "enc/contextual/cope/cope_math.h"
#include "enc/absolute/sinusoidal/sinusoidal_math.h"

namespace posenc::cli {
namespace {

struct PlotState {
  std::string what, out, len, dim, heads, base, text;
  CLI::Option* text_opt = nullptr;
};

const char* const kKinds = "sinusoid-matrix, sine-waves, rope-decay, alibi-bias, t5-buckets, cope-positions";

std::int64_t opt_int(const std::string& flag, const std::string& text, std::int64_t dflt, std::int64_t lo,
                     std::int64_t hi) {
  if (text.empty()) return dflt;
  const std::int64_t v = parse_int(flag, text);
  if (v < lo || v > hi)
    fail(Status::Invalid(flag, "expected " + std::to_string(lo) + " .. " + std::to_string(hi) + ", got " + text));
  return v;
}

std::string header(const std::string& png, int w, int h) {
  return "set terminal pngcairo size " + std::to_string(w) + "," + std::to_string(h) +
         " enhanced font 'sans,10'\nset output '" + png + "'\n";
}

// gnuplot single-quoted string: a quote is written twice.
std::string quoted(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("''") : std::string(1, c);
  return r + "'";
}

// The gnuplot script of `posenc plot sinusoid-matrix` into s.
void sinusoid_matrix(const PlotState& st, const std::string& png, std::ostringstream& s) {
  const std::int64_t L = opt_int("--len", st.len, 100, 1, 4096), D = opt_int("--dim", st.dim, 512, 2, 4096);
  if (D % 2) fail(Status::Invalid("--dim", "must be even"));
  const double n = st.base.empty() ? 10000.0 : parse_float("--base", st.base);
  if (!(n > 1)) fail(Status::Invalid("--base", "expected a number above 1"));
  s << header(png, 1000, 420) << "set title 'sinusoidal positional encoding, n = " << n << "'\n"
    << "set xlabel 'dimension'\nset ylabel 'position'\n"
    << "set xrange [-0.5:" << D - 0.5 << "]\nset yrange [" << L - 0.5 << ":-0.5]\n"
    << "set palette defined (-1 '#3b4cc0', 0 '#f7f7f7', 1 '#b40426')\nset cbrange [-1:1]\n$m << EOD\n";
  for (std::int64_t p = 0; p < L; ++p) {
    for (std::int64_t c = 0; c < D; ++c) s << (c ? " " : "") << sinusoid::value(double(p), c, D, n);
    s << "\n";
  }
  s << "EOD\nplot $m matrix with image notitle\n";
}

// The gnuplot script of `posenc plot sine-waves` into s.
void sine_waves(const PlotState& st, const std::string& png, std::ostringstream& s) {
  const std::int64_t D = opt_int("--dim", st.dim, 512, 2, 4096);
  if (D % 2) fail(Status::Invalid("--dim", "must be even"));
  const double n = st.base.empty() ? 10000.0 : parse_float("--base", st.base);
  if (!(n > 1)) fail(Status::Invalid("--base", "expected a number above 1"));
  s << header(png, 1400, 380) << "set multiplot layout 1,4\nset xlabel 'i (pair index)'\nset yrange [-1.1:1.1]\n";
  for (int k = 0; k < 16; k += 4) {
    s << "$w" << k << " << EOD\n";
    for (std::int64_t x = 0; x < 100; ++x) s << x << " " << std::sin(double(k) / std::pow(n, 2.0 * double(x) / double(D))) << "\n";
    s << "EOD\nset title 'k = " << k << "'\nplot $w" << k << " using 1:2 with lines lw 2 notitle\n";
  }
  s << "unset multiplot\n";
}

// The gnuplot script of `posenc plot rope-decay` into s.
void rope_decay(const PlotState& st, const std::string& png, std::ostringstream& s) {
  const std::int64_t D = opt_int("--dim", st.dim, 128, 2, 4096), L = opt_int("--len", st.len, 256, 1, 1 << 20);
  if (D % 2) fail(Status::Invalid("--dim", "must be even"));
  if (L * (D / 2) > (std::int64_t{1} << 24))  // a picture, not a computation: seconds at most
    fail(Status::OutOfRange("--len", "expected --len × --dim/2 <= 2^24 (16777216), got " + std::to_string(L) +
                                         " × " + std::to_string(D / 2)));
  const double theta = st.base.empty() ? 10000.0 : parse_float("--base", st.base);
  if (!(theta > 1)) fail(Status::Invalid("--base", "expected a number above 1"));
  s << header(png, 800, 500) << "set title 'RoPE long-term decay (d = " << D << ", theta = " << theta << ")'\n"
    << "set xlabel 'relative distance'\nset ylabel 'relative upper bound'\n$b << EOD\n";
  RopeParams rp;
  rp.theta = theta;
  const RopeFrequencies f = take(rope_frequencies(rp, D, 0));
  for (std::int64_t dist = 0; dist <= L; ++dist) {
    std::complex<double> partial = 0;
    double bound = 0;
    for (std::int64_t i = 0; i < D / 2; ++i) {
      partial += std::polar(1.0, f.angle(dist, i));
      bound += std::abs(partial);
    }
    s << dist << " " << bound / double(D / 2) << "\n";
  }
  s << "EOD\nplot $b using 1:2 with lines lw 2 notitle\n";
}

// The gnuplot script of `posenc plot alibi-bias` into s.
void alibi_bias(const PlotState& st, const std::string& png, std::ostringstream& s) {
  const std::int64_t H = opt_int("--heads", st.heads, 8, 1, 64), L = opt_int("--len", st.len, 12, 1, 256);
  const std::vector<double> m = alibi_slopes(H);
  const std::int64_t cols = H < 4 ? H : 4, rows = (H + cols - 1) / cols;
  s << header(png, int(300 * cols), int(280 * rows)) << "set multiplot layout " << rows << "," << cols << "\n"
    << "set xrange [-0.5:" << L - 0.5 << "]\nset yrange [" << L - 0.5 << ":-0.5]\n"
    << "set palette defined (0 '#08306b', 1 '#f7fbff')\nset xlabel 'key j'\nset ylabel 'query i'\n"
    << "set datafile missing 'NaN'\n";
  for (std::int64_t h = 0; h < H; ++h) {
    s << "$h" << h << " << EOD\n";
    for (std::int64_t i = 0; i < L; ++i) {
      for (std::int64_t j = 0; j < L; ++j) s << (j ? " " : "") << (j <= i ? -m[std::size_t(h)] * double(i - j) : NAN);
      s << "\n";
    }
    s << "EOD\nset title 'head " << h << ", m = 2^{" << std::log2(m[std::size_t(h)]) << "}'\n"
      << "plot $h" << h << " matrix with image notitle\n";
  }
  s << "unset multiplot\n";
}

// The gnuplot script of `posenc plot t5-buckets` into s.
void t5_buckets(const PlotState& st, const std::string& png, std::ostringstream& s) {
  const std::int64_t L = opt_int("--len", st.len, 256, 1, 1 << 20);
  T5Params bi, uni;
  uni.bidirectional = false;
  s << header(png, 900, 500) << "set title 'T5 relative-position buckets (32 buckets, max distance 128)'\n"
    << "set xlabel 'key position - query position'\nset ylabel 'bucket'\nset key left top\n$t << EOD\n";
  for (std::int64_t r = -L; r <= L; ++r) s << r << " " << t5_bucket(r, bi) << " " << t5_bucket(r, uni) << "\n";
  s << "EOD\nplot $t using 1:2 with steps lw 2 title 'bidirectional', $t using 1:3 with steps lw 2 dt 2 "
       "title 'unidirectional (decoder)'\n";
}

// The gnuplot script of `posenc plot cope-positions` into s.
void cope_positions(const PlotState& st, const std::string& png, std::ostringstream& s) {
  const std::string text =
      st.text_opt->count() == 0 ? "In the beginning God created the heaven and the earth." : st.text;
  if (text.empty() || text.size() > 200)
    fail(Status::Invalid("--text", "expected 1 .. 200 bytes, got " + std::to_string(text.size())));
  for (std::size_t j = 0; j < text.size(); ++j)  // one label per byte: a multi-byte character cannot be one
    if (text[j] < 0x20 || text[j] > 0x7e)
      fail(Status::Invalid("--text", "expected printable ASCII (each byte is a label), got byte " +
                                         std::to_string(static_cast<unsigned char>(text[j])) + " at offset " +
                                         std::to_string(j)));
  const std::int64_t N = std::int64_t(text.size());
  // gate logits: +8 on spaces (the query counts words), −8 elsewhere; p_j = Σ_{t ≥ j} σ(a_t)
  std::vector<double> g(text.size());
  for (std::size_t j = 0; j < text.size(); ++j) g[j] = cope::gate(text[j] == ' ' ? 8.0 : -8.0);
  s << header(png, 1100, 480) << "set title 'CoPE positions seen from the last byte: gates open on spaces'\n"
    << "set xlabel 'key byte'\nset ylabel 'position of the key'\nset key left top\nset xtics rotate by 0 font ',8'\nset xtics (";
  for (std::int64_t j = 0; j < N; ++j)
    s << (j ? ", " : "") << quoted(text[std::size_t(j)] == ' ' ? std::string("_") : std::string(1, text[std::size_t(j)])) << " " << j;
  s << ")\n$c << EOD\n";
  double suffix = 0;
  std::vector<double> p(text.size());
  for (std::int64_t j = N - 1; j >= 0; --j) p[std::size_t(j)] = suffix += g[std::size_t(j)];
  for (std::int64_t j = 0; j < N; ++j) s << j << " " << p[std::size_t(j)] << " " << (N - 1 - j) << "\n";
  s << "EOD\nplot $c using 1:2 with linespoints lw 2 pt 7 title 'CoPE: words counted', "
       "$c using 1:3 with lines lw 1 dt 2 title 'token distance i - j'\n";
}

std::string script(const PlotState& st, const std::string& png) {
  std::ostringstream s;
  s.precision(9);
  if (st.what == "sinusoid-matrix") sinusoid_matrix(st, png, s);
  else if (st.what == "sine-waves") sine_waves(st, png, s);
  else if (st.what == "rope-decay") rope_decay(st, png, s);
  else if (st.what == "alibi-bias") alibi_bias(st, png, s);
  else if (st.what == "t5-buckets") t5_buckets(st, png, s);
  else if (st.what == "cope-positions") cope_positions(st, png, s);
  else fail(Status::Invalid("WHAT", "expected one of " + std::string(kKinds) + ", got '" + st.what + "'"));
  return s.str();
}

// The options each picture reads; any other one given is an error rather than silently ignored.
void check_options(const PlotState& st, const CLI::App& app) {
  static const std::pair<const char*, const char*> kReads[] = {
      {"sinusoid-matrix", "--len --dim --base"}, {"sine-waves", "--dim --base"},
      {"rope-decay", "--len --dim --base"},      {"alibi-bias", "--len --heads"},
      {"t5-buckets", "--len"},                   {"cope-positions", "--text"}};
  for (const auto& [kind, reads] : kReads) {
    if (st.what != kind) continue;
    for (const char* flag : {"--len", "--dim", "--heads", "--base", "--text"}) {
      const std::string list = std::string(" ") + reads + " ";
      if (app.count(flag) > 0 && list.find(std::string(" ") + flag + " ") == std::string::npos)
        fail(Status::Invalid(flag, std::string(kind) + " does not read it (it reads " + reads + ")"));
    }
  }
}

void run_plot(const PlotState& st, const CLI::App& app) {
  if (st.out.empty()) fail(Status::Invalid("--out", "expected a .png path"));
  {  // the picture is a PNG: its name says so (a device such as /dev/stdout is written as it is)
    std::string ext = std::filesystem::path(st.out).extension().string();
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::error_code ec;
    const bool device = std::filesystem::exists(st.out, ec) && !std::filesystem::is_regular_file(st.out, ec) &&
                        !std::filesystem::is_directory(st.out, ec);
    if (ext != ".png" && !device)
      fail(Status::Invalid("--out", "expected a path ending in .png (the picture is a PNG), got '" + st.out + "'"));
  }
  check_options(st, app);
  if (!gnuplot_found()) fail(Status::Io("--out", "plots need gnuplot (apt-get install gnuplot-nox)"));
  OutputSet outs;
  check(outs.reserve("--out", st.out));
  // gnuplot draws into the temporary folder; the picture is read back and written like any output
  std::error_code ec;
  const std::filesystem::path tmpdir = std::filesystem::temp_directory_path(ec);
  GnuplotJob job;
  job.png = (ec ? std::filesystem::path("/tmp") : tmpdir) / ("posenc-plot-" + std::to_string(getpid()) + ".png");
  job.script = script(st, job.png);
  job.script_path = job.png + ".gp";
  job.arg = "--out";
  job.missing = "plots need gnuplot (apt-get install gnuplot-nox)";
  job.script_failed = "cannot write the gnuplot script " + job.script_path;
  job.draw_failed = "gnuplot failed to draw " + st.out;
  job.incomplete = "gnuplot could not write the whole picture to " + job.png + " (is that disk full?)";
  Expected<std::string> png = draw_png(job);
  std::remove(job.png.c_str());
  check(png.status());
  // written as every output is (cli/output_set.h): replaced by a rename, a link's target, a device in place
  outs.attach_bytes("--out", std::move(png).value());
  check(outs.commit());
  std::printf("wrote %s\n", st.out.c_str());
}

}  // namespace

Command add_plot_command(CLI::App& root) {
  auto st = std::make_shared<PlotState>();
  CLI::App* app = root.add_subcommand("plot", std::string("draw what the articles draw: ") + kKinds);
  app->add_option("WHAT", st->what, kKinds)->required();
  add_text(app, "--out", &st->out, "the PNG to write", "FILE");
  add_text(app, "--len", &st->len, "positions / window / distance range (per picture)", "INT");
  add_text(app, "--dim", &st->dim, "dimension d (sinusoid-matrix, sine-waves, rope-decay)", "INT");
  add_text(app, "--heads", &st->heads, "alibi-bias: heads (default 8)", "INT");
  add_text(app, "--base", &st->base, "sinusoid n or RoPE theta (default 10000)", "FLOAT");
  st->text_opt = add_text(app, "--text", &st->text,
                          "cope-positions: the sentence, printable ASCII (each byte is a label), 1 .. 200 bytes "
                          "(default: Genesis 1:1)",
                          "TEXT");
  return {app, [st, app] { run_plot(*st, *app); }};
}

}  // namespace posenc::cli
