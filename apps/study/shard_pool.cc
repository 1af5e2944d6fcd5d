#include "study/shard_pool.h"

#include <pthread.h>

#include <atomic>

namespace posenc::model_fast {

namespace {
std::atomic<ShardPool*> g_pool{nullptr};
std::mutex g_pool_mu;
}  // namespace

// The pool lives until the process ends (its idle workers are never joined: nothing to clean up, and
// no static destructor to order). A child of fork() has none of the parent's workers, so it starts a
// pool of its own (the parent's, unreachable there, is left as it is).
ShardPool& ShardPool::instance() {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { g_pool.store(nullptr); });
    return true;
  }();
  (void)registered;
  ShardPool* p = g_pool.load();
  if (p) return *p;
  const std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!(p = g_pool.load())) g_pool.store(p = new ShardPool);
  return *p;
}

void ShardPool::run(int n, const std::function<void(int)>& f) {
  if (n <= 1) {
    if (n == 1) f(0);
    return;
  }
  const std::lock_guard<std::mutex> one_job(submit_);
  {
    const std::lock_guard<std::mutex> lk(m_);
    while (int(workers_.size()) < n - 1) {
      const int index = int(workers_.size()) + 1;
      const std::uint64_t before = epoch_;  // the job about to start is the first it waits for
      workers_.emplace_back([this, index, before] { work(index, before); });
    }
    job_ = &f;
    active_ = n;
    pending_ = n - 1;
    ++epoch_;
  }
  start_.notify_all();
  f(0);
  std::unique_lock<std::mutex> lk(m_);
  done_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
}

void ShardPool::work(int index, std::uint64_t seen) {
  std::unique_lock<std::mutex> lk(m_);
  for (;;) {
    start_.wait(lk, [&] { return epoch_ != seen; });
    seen = epoch_;
    if (index >= active_) continue;  // this job needs fewer shards
    const std::function<void(int)>* job = job_;
    lk.unlock();
    (*job)(index);
    lk.lock();
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace posenc::model_fast
