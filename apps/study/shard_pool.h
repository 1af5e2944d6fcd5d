// The model's shard threads: run(n, f) calls f(0) on the calling thread and f(1) .. f(n − 1) on
// persistent worker threads, and returns when all n calls have. Workers sleep on a condition
// variable between jobs (no spinning: on a machine shared with other work, a thread spinning at a
// barrier takes the core its partner needs), so a job costs two wake-ups; the model runs two per
// training step. Workers are created on first need and kept. One job at a time: a second caller
// waits for the first job to finish. f must not call run() itself (nested model passes open
// ThreadScope(1) and never get here). The pool lives as long as the process; a fork() child gets a
// fresh one.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace posenc::model_fast {

class ShardPool {
 public:
  static ShardPool& instance();
  void run(int n, const std::function<void(int)>& f);

 private:
  ShardPool() = default;
  void work(int index, std::uint64_t seen);  // seen: the last epoch before the worker existed

  std::mutex submit_;  // one job at a time
  std::mutex m_;       // guards everything below
  std::condition_variable start_, done_;
  std::vector<std::thread> workers_;  // worker i runs shard i + 1
  const std::function<void(int)>* job_ = nullptr;
  std::uint64_t epoch_ = 0;  // one per job
  int active_ = 0, pending_ = 0;
};

}  // namespace posenc::model_fast
