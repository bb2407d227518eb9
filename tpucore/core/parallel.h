/// @file
/// A persistent host thread pool and parallel_for.
///
/// Small ranges run inline on the calling thread (no thread start-up, no wake-up), so tiny
/// ops stay cheap. Large ranges are split into one contiguous chunk per thread; the calling
/// thread works on the first chunk. Nested calls from inside a chunk run inline. Idle pool
/// threads spin briefly for the next job (adapted to how soon jobs have been following each
/// other, at most TPU_POOL_SPIN_US, default 20 us), then sleep on a futex; see parallel.cpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace tpu {

/// Number of threads parallel_for uses (the calling thread included). Defaults to the
/// number of online CPUs; TPU_NUM_THREADS overrides it.
int num_threads();
/// Sets the number of threads parallel_for uses (values below 1 count as 1).
void set_num_threads(int n);

/// A reusable barrier for the threads of one parallel_team: arrive_and_wait() returns once
/// `parties` threads have arrived. Waiters spin for a short while (TPU_POOL_SPIN_US, default
/// 20 us), then sleep until the last one arrives.
class Barrier {
 public:
  /// A barrier for `parties` threads (at least 1).
  explicit Barrier(int parties) : parties_(static_cast<uint32_t>(parties < 1 ? 1 : parties)) {}
  /// Blocks until all `parties` threads have called it, then all return; reusable.
  void arrive_and_wait();

 private:
  const uint32_t parties_;
  std::atomic<uint32_t> count_{0};
  std::atomic<uint32_t> phase_{0};     ///< futex word
  std::atomic<uint32_t> sleepers_{0};  ///< threads asleep (or about to be) on phase_
};

/// Runs fn(t, team, barrier) once for every t in [0, team), all `team` calls at the same time
/// on different threads (the caller is t = 0), with one Barrier of `team` parties they may
/// synchronize on (every call must then reach each barrier, also when it fails).
/// team = min(want, num_threads(), pool threads); it is 1 (fn(0, 1, ...) on the caller) inside
/// a parallel region or with one thread configured. An exception thrown by fn is rethrown here.
void parallel_team(int want, const std::function<void(int t, int team, Barrier& barrier)>& fn);

namespace detail {
void parallel_run(int64_t begin, int64_t end, int chunks,
                  const std::function<void(int64_t, int64_t)>& fn);
bool in_parallel_region();
}  // namespace detail

/// Calls fn(b, e) over disjoint sub-ranges covering [begin, end). Runs inline when the
/// range is at most `grain` long, when one thread is configured, or when already inside a
/// parallel region.
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
