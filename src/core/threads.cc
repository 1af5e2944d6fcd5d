#include "posenc/threads.h"

#include <omp.h>

#include <atomic>

namespace posenc {
namespace {
std::atomic<int> g_threads{0};
}

int num_threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : omp_get_max_threads();
}

void set_num_threads(int n) { g_threads.store(n > 0 ? n : 0, std::memory_order_relaxed); }

}  // namespace posenc
