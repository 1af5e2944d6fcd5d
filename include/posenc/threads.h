// posenc/threads.h — how many threads the fast kernels use (OpenMP, over tokens × heads or bias rows).
// Small calls (below a few tens of thousands of elements) always run on the calling thread.
#pragma once

namespace posenc {

// The current count: the last set_num_threads(n > 0), else OpenMP's default (OMP_NUM_THREADS or the
// number of cores).
int num_threads();
// n ≥ 1 sets the count; n ≤ 0 restores OpenMP's default. Process-wide.
void set_num_threads(int n);

}  // namespace posenc
