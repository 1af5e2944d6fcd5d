#include "posenc/threads.h"

#include <omp.h>

#include <atomic>

namespace posenc {
namespace {
std::atomic<int> g_threads{0};
thread_local int t_override = 0;  // > 0: this thread's ThreadScope count
}  // namespace

int num_threads() {
  if (t_override > 0) return t_override;
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : omp_get_max_threads();
}

void set_num_threads(int n) { g_threads.store(n > 0 ? n : 0, std::memory_order_relaxed); }

ThreadScope::ThreadScope(int n) : prev_(t_override) { t_override = n > 0 ? n : 0; }
ThreadScope::~ThreadScope() { t_override = prev_; }

}  // namespace posenc
