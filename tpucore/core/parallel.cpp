#include "tpucore/core/parallel.h"

#include "tpucore/core/env.h"
#include "tpucore/core/idle_prefetch.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <unordered_map>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace tpu {
namespace {

thread_local bool t_in_region = false;
thread_local bool t_pool_worker = false;
// The range prefetch_after_chunk() asked for in the current chunk of this worker.
thread_local const char* t_pf_ptr = nullptr;
thread_local size_t t_pf_bytes = 0;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins while pred() holds, for at most `limit_ns`; returns the time spent (ns) and whether
// pred() stopped holding (the clock is read once per 32 polls).
template <class Pred>
bool spin_while(Pred pred, int64_t limit_ns, int64_t* spent_ns) {
  const int64_t t0 = now_ns();
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (!pred()) {
        *spent_ns = now_ns() - t0;
        return true;
      }
      cpu_relax();
    }
    const int64_t dt = now_ns() - t0;
    if (dt >= limit_ns) {
      *spent_ns = dt;
      return false;
    }
  }
}

// Sleeps while *word == old (futex wait; without futexes, a yield). Spurious returns are fine:
// callers loop.
void futex_wait(std::atomic<uint32_t>* word, uint32_t old) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, old, nullptr, nullptr, 0);
#else
  if (word->load(std::memory_order_acquire) == old) std::this_thread::yield();
#endif
}
void futex_wake_all(std::atomic<uint32_t>* word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

// Sleeps until *word != old. `sleepers` counts the threads that may be asleep on the word, so
// that a writer (store, then wake_sleepers) makes a system call only when someone sleeps: the
// sequentially consistent increment-then-load here and store-then-load there guarantee that
// either this thread sees the new value or the writer sees it counted.
void sleep_while_equal(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers, uint32_t old) {
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  while (word.load(std::memory_order_seq_cst) == old) futex_wait(&word, old);
  sleepers.fetch_sub(1, std::memory_order_release);
}
void wake_sleepers(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers) {
  if (sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&word);
}

// Longest spin (ns) of an idle worker before it sleeps, and of the caller waiting for the
// other chunks; TPU_POOL_SPIN_US overrides (0: sleep at once).
int64_t max_spin_ns() {
  static const int64_t v = [] {
    if (auto us = env_int("TPU_POOL_SPIN_US", 0, 100000, "using 200 us")) return *us * 1000;
    // 200 us: the serial ops between the products of an LLM decode step (norms, RoPE,
    // attention, sampling) leave gaps of tens of us, and on the 2-core Intel Xeon VM a futex
    // sleep and wake-up per product cost more than spinning through them: ~100M decode at batch
    // 16 on two threads went 359-380 -> 453-472 tokens/s (20 -> 200 us), and in tokens per
    // CPU-second 221-230 -> 234-243.
    return int64_t{200000};
  }();
  return v;
}

// One job at a time. The job word packs a sequence number (upper bits) with the number of
// chunks (lower 13 bits), so a worker learns from one atomic load both that a job arrived and
// whether it takes part. Idle workers spin for a while, then sleep on the job word (a futex,
// see sleep_while_equal); the caller waits for the other chunks the same way. The spin
// adapts per worker to how quickly jobs follow one another: a job that arrived during the
// spin, or soon after the worker fell asleep, sets the spin to twice that gap (at most
// max_spin_ns()); a gap longer than that halves it (down to 1 us). Back-to-back jobs (a GEMM's
// phases) are picked up without a wake-up, while jobs further apart (LLM decode between
// small matmuls) cost no spinning CPU.
class ThreadPool {
 public:
  static constexpr uint32_t kChunkBits = 13;
  static constexpr uint32_t kChunkMask = (1u << kChunkBits) - 1u;
  static constexpr uint32_t kStop = kChunkMask;  // chunk field value that means "exit"

  explicit ThreadPool(int workers) {
    workers = std::min<int>(workers, static_cast<int>(kChunkMask) - 2);  // chunks < kStop
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { loop(i + 1); });
  }
  ~ThreadPool() {
    publish(kStop);
    for (auto& t : threads_) t.join();
  }
  int workers() const { return static_cast<int>(threads_.size()); }

  void run(int64_t begin, int64_t end, int chunks, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> job_lock(job_mu_);  // one job in flight
    fn_ = &fn;
    begin_ = begin;
    end_ = end;
    chunks_ = chunks;
    error_ = nullptr;
    remaining_.store(static_cast<uint32_t>(chunks - 1), std::memory_order_relaxed);
    publish(static_cast<uint32_t>(chunks));
    t_in_region = true;
    run_chunk(0);
    t_in_region = false;
    // Wait for the other chunks: spin, then sleep until the last one notifies.
    int64_t spent = 0;
    if (!spin_while([&] { return remaining_.load(std::memory_order_acquire) != 0; }, max_spin_ns(), &spent)) {
      for (uint32_t r = remaining_.load(std::memory_order_seq_cst); r != 0;
           r = remaining_.load(std::memory_order_seq_cst))
        sleep_while_equal(remaining_, remaining_sleepers_, r);
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // The range of prefetch_after_chunk() into this core's L2 (prefetcht1), 2 KiB at a time, until
  // it ends or a job arrives.
  void idle_prefetch(uint32_t seen) {
    const char* p = t_pf_ptr;
    const char* const end = p + t_pf_bytes;
    t_pf_ptr = nullptr;
    for (; p < end && word_.load(std::memory_order_relaxed) == seen; p += 2048) {
      const char* const e = std::min(end, p + 2048);
      for (const char* q = p; q < e; q += 64) __builtin_prefetch(q, 0, 2);
    }
  }

  void publish(uint32_t chunks) {
    const uint32_t w = word_.load(std::memory_order_relaxed);
    word_.store(((w >> kChunkBits) + 1) << kChunkBits | chunks, std::memory_order_seq_cst);
    wake_sleepers(word_, word_sleepers_);  // a system call only when some worker sleeps
  }

  void run_chunk(int c) {
    const int64_t n = end_ - begin_;
    const int64_t b = begin_ + n * c / chunks_;
    const int64_t e = begin_ + n * (c + 1) / chunks_;
    if (b >= e) return;
    try {
      (*fn_)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lk(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
  }

  void loop(int id) {
    t_in_region = true;
    t_pool_worker = true;
    uint32_t seen = 0;  // the word before any job (a job may be published before this thread runs)
    int64_t spin_ns = max_spin_ns();
    for (;;) {
      int64_t gap = 0;
      const bool caught = spin_while([&] { return word_.load(std::memory_order_acquire) == seen; }, spin_ns, &gap);
      if (!caught) {
        const int64_t t_sleep = now_ns() - gap;
        sleep_while_equal(word_, word_sleepers_, seen);
        gap = now_ns() - t_sleep;
      }
      const int64_t cap = max_spin_ns();
      if (gap <= cap)  // a longer spin pays (or paid) off: keep twice this gap
        spin_ns = std::min(cap, caught ? std::max(spin_ns, 2 * gap) : 2 * gap);
      else  // jobs far apart: spin less
        spin_ns = std::max<int64_t>(std::min<int64_t>(1000, cap), spin_ns / 2);
      seen = word_.load(std::memory_order_acquire);
      const uint32_t chunks = seen & kChunkMask;
      if (chunks == kStop) return;
      if (static_cast<uint32_t>(id) < chunks) {
        t_pf_ptr = nullptr;
        run_chunk(id);
        if (remaining_.fetch_sub(1, std::memory_order_seq_cst) == 1) wake_sleepers(remaining_, remaining_sleepers_);
        if (t_pf_ptr) idle_prefetch(seen);
      }
    }
  }

  std::vector<std::thread> threads_;
  std::mutex job_mu_;
  std::mutex error_mu_;
  std::atomic<uint32_t> word_{0};  // job word (futex)
  std::atomic<uint32_t> word_sleepers_{0};
  std::atomic<uint32_t> remaining_{0};  // chunks of the job still running (futex)
  std::atomic<uint32_t> remaining_sleepers_{0};
  std::exception_ptr error_;
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

void parallel_team(int want, const std::function<void(int, int, Barrier&)>& fn) {
  int team = std::min(want, num_threads());
  if (team > 1 && !t_in_region) team = std::min(team, pool().workers() + 1);
  if (team <= 1 || t_in_region) {
    Barrier solo(1);
    fn(0, 1, solo);
    return;
  }
  Barrier bar(team);
  // One chunk of one index per thread: every pool thread with id < team runs exactly one.
  pool().run(0, team, team, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) fn(static_cast<int>(t), team, bar);
  });
}

void Barrier::arrive_and_wait() {
  if (parties_ <= 1) return;
  const uint32_t ph = phase_.load(std::memory_order_acquire);
  if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == parties_) {
    count_.store(0, std::memory_order_relaxed);
    phase_.store(ph + 1, std::memory_order_seq_cst);
    wake_sleepers(phase_, sleepers_);
    return;
  }
  int64_t spent = 0;
  if (spin_while([&] { return phase_.load(std::memory_order_acquire) == ph; }, max_spin_ns(), &spent)) return;
  sleep_while_equal(phase_, sleepers_, ph);
}

namespace detail {
bool in_parallel_region() { return t_in_region; }

void prefetch_after_chunk(const void* p, size_t bytes) {
  static const bool enabled = env_int("TPU_IDLE_PREFETCH", 0, 1, "prefetching").value_or(1) != 0;
  if (!t_pool_worker || !enabled) return;  // TPU_IDLE_PREFETCH=0: no request is kept
  t_pf_ptr = static_cast<const char*>(p);
  t_pf_bytes = bytes;
}

NextWeight follow_weight(const void* w, size_t bytes) {
  thread_local std::unordered_map<const void*, NextWeight> next;
  thread_local const void* prev = nullptr;
  if (next.size() > 4096) next.clear();  // addresses of weights long freed
  if (prev && prev != w) next[prev] = NextWeight{w, bytes};
  prev = w;
  auto it = next.find(w);
  return it == next.end() ? NextWeight{} : it->second;
}

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
