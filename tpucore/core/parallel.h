// A persistent host thread pool and parallel_for.
//
// Small ranges run inline on the calling thread (no thread start-up, no wake-up), so tiny
// ops stay cheap. Large ranges are split into one contiguous chunk per thread; the calling
// thread works on the first chunk. Nested calls from inside a chunk run inline.
#pragma once

#include <cstdint>
#include <functional>

namespace tpu {

// Number of threads parallel_for uses (the calling thread included). Defaults to the
// number of online CPUs; TPU_NUM_THREADS overrides it.
int num_threads();
void set_num_threads(int n);

namespace detail {
void parallel_run(int64_t begin, int64_t end, int chunks,
                  const std::function<void(int64_t, int64_t)>& fn);
bool in_parallel_region();
}  // namespace detail

// Calls fn(b, e) over disjoint sub-ranges covering [begin, end). Runs inline when the
// range is at most `grain` long, when one thread is configured, or when already inside a
// parallel region.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int nt = num_threads();
  if (n <= grain || nt <= 1 || detail::in_parallel_region()) {
    fn(begin, end);
    return;
  }
  int64_t chunks = (n + grain - 1) / grain;
  if (chunks > nt) chunks = nt;
  detail::parallel_run(begin, end, static_cast<int>(chunks),
                       std::function<void(int64_t, int64_t)>(std::ref(fn)));
}

}  // namespace tpu
