// posenc/threads.h — how many threads the fast kernels use (OpenMP, over tokens × heads or bias rows).
// Small calls (below a few tens of thousands of elements) always run on the calling thread.
#pragma once

namespace posenc {

// The current count on the calling thread: its ThreadScope's count while one is open, else the last
// set_num_threads(n > 0), else OpenMP's default (OMP_NUM_THREADS or the number of cores).
int num_threads();
// n ≥ 1 sets the count; n ≤ 0 restores OpenMP's default. Process-wide (a ThreadScope still wins on
// its own thread).
void set_num_threads(int n);

// Overrides num_threads() on the calling thread only, for the scope's lifetime (n ≤ 0: the
// process-wide count inside the scope); scopes nest and restore the previous override on exit. A
// worker that runs its own share of a larger job opens ThreadScope(1) so that every kernel it calls
// stays on it (the model's batch shards do).
class ThreadScope {
 public:
  explicit ThreadScope(int n);
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int prev_;
};

}  // namespace posenc
