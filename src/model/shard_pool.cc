#include "model/shard_pool.h"

namespace posenc::model_fast {

ShardPool& ShardPool::instance() {
  static ShardPool pool;
  return pool;
}

ShardPool::~ShardPool() {
  {
    const std::lock_guard<std::mutex> lk(m_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : workers_) t.join();
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
    start_.wait(lk, [&] { return stop_ || epoch_ != seen; });
    if (stop_) return;
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
