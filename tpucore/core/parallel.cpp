#include "tpucore/core/parallel.h"

#include "tpucore/core/env.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace tpu {
namespace {

thread_local bool t_in_region = false;

// One job at a time; workers spin briefly for the next job before they sleep, so a burst
// of parallel ops does not pay a futex wake-up each time.
class ThreadPool {
 public:
  explicit ThreadPool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { loop(i + 1); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int workers() const { return static_cast<int>(threads_.size()); }

  void run(int64_t begin, int64_t end, int chunks, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> job_lock(job_mu_);  // one job in flight
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      begin_ = begin;
      end_ = end;
      chunks_ = chunks;
      pending_.store(chunks - 1, std::memory_order_relaxed);
      gen_atomic_.store(generation_ + 1, std::memory_order_release);
      ++generation_;
    }
    cv_.notify_all();
    t_in_region = true;
    run_chunk(0);
    t_in_region = false;
    // Wait for the other chunks.
    while (pending_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  }

 private:
  void run_chunk(int c) {
    const int64_t n = end_ - begin_;
    const int64_t b = begin_ + n * c / chunks_;
    const int64_t e = begin_ + n * (c + 1) / chunks_;
    if (b < e) (*fn_)(b, e);
  }
  void loop(int id) {
    uint64_t seen = 0;
    t_in_region = true;
    for (;;) {
      // Spin a little for the next job, then sleep.
      bool got = false;
      for (int spin = 0; spin < 4000; ++spin) {
        if (gen_atomic_.load(std::memory_order_acquire) != seen) { got = true; break; }
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
      if (!got) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return generation_ != seen || stop_; });
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_) return;
        seen = generation_;
      }
      if (id < chunks_) {
        run_chunk(id);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  std::vector<std::thread> threads_;
  std::mutex job_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> gen_atomic_{0};
  std::atomic<int> pending_{0};
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t begin_ = 0, end_ = 0;
  int chunks_ = 1;
};

int default_threads() {
  if (auto v = env_int("TPU_NUM_THREADS", 1, 4096, "using one thread per hardware thread")) return static_cast<int>(*v);
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

std::atomic<int> g_threads{0};

ThreadPool& pool() {
  static ThreadPool p(default_threads() - 1 > 0 ? default_threads() - 1 : 0);
  return p;
}

}  // namespace

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n == 0) {
    n = default_threads();
    g_threads.store(n, std::memory_order_relaxed);
  }
  return n;
}

void set_num_threads(int n) { g_threads.store(n < 1 ? 1 : n, std::memory_order_relaxed); }

namespace detail {
bool in_parallel_region() { return t_in_region; }

void parallel_run(int64_t begin, int64_t end, int chunks,
                  const std::function<void(int64_t, int64_t)>& fn) {
  ThreadPool& p = pool();
  if (chunks > p.workers() + 1) chunks = p.workers() + 1;
  if (chunks <= 1) {
    fn(begin, end);
    return;
  }
  p.run(begin, end, chunks, fn);
}
}  // namespace detail

}  // namespace tpu
