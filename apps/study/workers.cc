// study/workers.cc — the worker processes and their pipe protocol. Parent to worker: job indices
// as int32 (−1: stop). Worker to parent, one line each: "P index step loss" (progress), "R index json"
// (a job's rows, study/jobs.h) or "E message" (the worker failed and exits).
#include "study/workers.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <optional>
#include <string>

#include "study/results.h"
#include "posenc/threads.h"

namespace posenc {
namespace {

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

// A worker: reads job indices from `in`, runs each, and writes its lines to `out`. Never returns.
[[noreturn]] void worker_main(const StudyConfig& cfg, const Corpus& corpus, const std::vector<StudyJob>& jobs,
                              int threads, int in, int out) {
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
    Expected<std::vector<StudyResult>> r = run_job(cfg, corpus, jobs[std::size_t(idx)], std::size_t(idx),
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
    if (!write_all(out, "R " + std::to_string(idx) + " " + job_rows_to_json(r.value()) + "\n")) _exit(3);
  }
}

struct Child {
  pid_t pid = -1;
  int to = -1, from = -1;
  std::string buf;
  bool open = false;
};

// Ends every started worker (SIGTERM) and waits for it.
void stop_all(std::vector<Child>& kids) {
  for (Child& c : kids)
    if (c.pid > 0) kill(c.pid, SIGTERM);
  for (Child& c : kids)
    if (c.pid > 0) waitpid(c.pid, nullptr, 0);
}

// Forks the workers, each with a pipe down (indices) and one up (lines).
Status start_workers(std::vector<Child>& kids, const StudyConfig& cfg, const Corpus& corpus,
                     const std::vector<StudyJob>& jobs, int per_worker) {
  std::fflush(nullptr);
  for (Child& c : kids) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) {
      stop_all(kids);
      return Status::Internal("cannot create a pipe for a study worker");
    }
    const pid_t pid = fork();
    if (pid < 0) {
      stop_all(kids);
      return Status::Internal("cannot start a study worker (fork failed)");
    }
    if (pid == 0) {
      close(down[1]);
      close(up[0]);
      for (const Child& o : kids)  // the earlier workers' pipe ends are not this worker's
        if (o.pid > 0) close(o.to), close(o.from);
      worker_main(cfg, corpus, jobs, per_worker, down[0], up[1]);
    }
    close(down[0]);
    close(up[1]);
    c.pid = pid;
    c.to = down[1];
    c.from = up[0];
    c.open = true;
  }
  return Status::Ok();
}

// The parent's side: hands out indices, collects results, passes progress on.
class Collector {
 public:
  Collector(std::size_t n, const StudyProgress& progress) : results_(n), progress_(progress) {}

  bool done() const { return finished_ == results_.size(); }
  // Sends the worker the next index, or −1 when there is none.
  void hand_out(Child& c) {
    const std::int32_t idx = next_ < results_.size() ? std::int32_t(next_++) : -1;
    write_all(c.to, std::string(reinterpret_cast<const char*>(&idx), sizeof idx));
  }
  // One line from worker c; the error that ends the study, or empty.
  std::string line(Child& c, const std::string& line) {
    if (line.rfind("P ", 0) == 0) {
      std::size_t e = 0;
      long long s = 0;
      double l = 0;
      if (std::sscanf(line.c_str() + 2, "%zu %lld %lg", &e, &s, &l) == 3 && e < results_.size() && progress_)
        progress_(e, s, l);
    } else if (line.rfind("R ", 0) == 0) {
      std::size_t at = 0;
      int used = 0;
      if (std::sscanf(line.c_str() + 2, "%zu %n", &at, &used) != 1) return "a study worker sent a malformed result";
      Expected<std::vector<StudyResult>> r = job_rows_from_json(line.substr(2 + std::size_t(used)));
      if (!r.ok()) return "a study worker sent a malformed result";
      if (at >= results_.size() || results_[at]) return "a study worker sent a result for a job it was not given";
      results_[at] = std::move(r).value();
      ++finished_;
      hand_out(c);
    } else if (line.rfind("E ", 0) == 0) {
      return line.substr(2);
    }
    return {};
  }
  std::vector<std::vector<StudyResult>> results() {
    std::vector<std::vector<StudyResult>> out;
    for (auto& r : results_) out.push_back(std::move(*r));
    return out;
  }

 private:
  std::vector<std::optional<std::vector<StudyResult>>> results_;
  const StudyProgress& progress_;
  std::size_t next_ = 0, finished_ = 0;
};

// Reads the workers' lines until every result is in; the error that ended it, or empty.
std::string collect(std::vector<Child>& kids, Collector& col) {
  for (Child& c : kids) col.hand_out(c);
  while (!col.done()) {
    std::vector<pollfd> fds;
    std::vector<Child*> who;
    for (Child& c : kids)
      if (c.open) fds.push_back({c.from, POLLIN, 0}), who.push_back(&c);
    if (fds.empty()) return "study workers ended before every job was run";
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return "poll failed";
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
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
      for (std::size_t nl; (nl = c.buf.find('\n')) != std::string::npos;) {
        const std::string line = c.buf.substr(0, nl);
        c.buf.erase(0, nl + 1);
        if (std::string error = col.line(c, line); !error.empty()) return error;
      }
    }
  }
  return {};
}

}  // namespace

Expected<std::vector<std::vector<StudyResult>>> train_in_workers(const StudyConfig& cfg, const Corpus& corpus,
                                                                 const std::vector<StudyJob>& jobs, int workers,
                                                                 int threads_per_worker,
                                                                 const StudyProgress& progress) {
  std::vector<Child> kids(static_cast<std::size_t>(workers));
  if (Status s = start_workers(kids, cfg, corpus, jobs, threads_per_worker); !s.ok()) return s;
  signal(SIGPIPE, SIG_IGN);
  Collector col(jobs.size(), progress);
  const std::string error = collect(kids, col);
  for (Child& c : kids) {
    close(c.to);
    close(c.from);
  }
  if (!error.empty()) {
    stop_all(kids);
    return Status::Internal(error);
  }
  for (Child& c : kids) {
    int st = 0;
    waitpid(c.pid, &st, 0);
  }
  return col.results();
}

}  // namespace posenc
