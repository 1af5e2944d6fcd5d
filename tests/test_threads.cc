// posenc/threads.h: the process-wide count and the per-thread override (ThreadScope).
#include <gtest/gtest.h>

#include <omp.h>

#include <thread>

#include "posenc/threads.h"

namespace posenc {
namespace {

TEST(Threads, ScopeOverridesOnlyTheCallingThread) {
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  {
    const ThreadScope one(1);
    EXPECT_EQ(num_threads(), 1);
    int other = 0;
    std::thread t([&] { other = num_threads(); });  // another thread sees the process-wide count
    t.join();
    EXPECT_EQ(other, 3);
    {
      const ThreadScope five(5);  // nested: the innermost wins, the outer one comes back
      EXPECT_EQ(num_threads(), 5);
      const ThreadScope none(0);  // n ≤ 0: the process-wide count inside
      EXPECT_EQ(num_threads(), 3);
    }
    EXPECT_EQ(num_threads(), 1);
    set_num_threads(4);  // the process-wide count changes underneath; the override still wins here
    EXPECT_EQ(num_threads(), 1);
  }
  EXPECT_EQ(num_threads(), 4);
  set_num_threads(0);
  EXPECT_EQ(num_threads(), omp_get_max_threads());
}

}  // namespace
}  // namespace posenc
