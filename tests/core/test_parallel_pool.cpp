// The host thread pool (tpucore/core/parallel.h): many small jobs, jobs submitted from several
// threads at once, nested calls, exceptions, parallel_team with its barrier, and idle workers
// that sleep instead of spinning. Every loop is bounded in count.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ops/cpu/kernels/gemv.h"
#include "tpucore/core/idle_prefetch.h"
#include "tpucore/core/parallel.h"

namespace {

// Restores the configured thread count at the end of a test.
struct ThreadsGuard {
  int saved = tpu::num_threads();
  explicit ThreadsGuard(int n) { tpu::set_num_threads(n); }
  ~ThreadsGuard() { tpu::set_num_threads(saved); }
};

double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Sum of i over [b, e) in closed form, the independent reference of the chunked sums.
int64_t range_sum(int64_t b, int64_t e) { return (e - 1 + b) * (e - b) / 2; }

}  // namespace

TEST_CASE("thread pool: many small jobs each cover their range exactly once", "[core][pool]") {
  ThreadsGuard g(2);
  for (int job = 0; job < 5000; ++job) {
    const int64_t n = 2 + job % 37;
    std::atomic<int64_t> sum{0}, calls{0};
    tpu::parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
      int64_t s = 0;
      for (int64_t i = b; i < e; ++i) s += i;
      sum += s;
      ++calls;
    });
    REQUIRE(sum.load() == range_sum(0, n));
    REQUIRE(calls.load() >= 1);
    REQUIRE(calls.load() <= tpu::num_threads());
  }
}

TEST_CASE("thread pool: jobs from several threads at once, and nested calls", "[core][pool]") {
  ThreadsGuard g(2);
  std::atomic<int> bad{0};
  std::vector<std::thread> users;
  for (int u = 0; u < 4; ++u)
    users.emplace_back([&, u] {
      for (int job = 0; job < 300; ++job) {
        const int64_t n = 100 + 17 * u + job % 50;
        std::atomic<int64_t> sum{0};
        tpu::parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
          // A nested call runs inline on this thread and must still cover its range.
          std::atomic<int64_t> inner{0};
          tpu::parallel_for(b, e, 1, [&](int64_t ib, int64_t ie) {
            int64_t s = 0;
            for (int64_t i = ib; i < ie; ++i) s += i;
            inner += s;
          });
          sum += inner.load();
        });
        if (sum.load() != range_sum(0, n)) ++bad;
      }
    });
  for (auto& t : users) t.join();
  CHECK(bad.load() == 0);
}

TEST_CASE("thread pool: an exception in a chunk reaches the caller, the pool stays usable", "[core][pool]") {
  ThreadsGuard g(2);
  for (int round = 0; round < 20; ++round) {
    // Throw from the last chunk (a worker's when there are two threads) and from the first
    // (the caller's).
    const int64_t bad_index = round % 2 ? 0 : 999;
    CHECK_THROWS_WITH(tpu::parallel_for(0, 1000, 1,
                                        [&](int64_t b, int64_t e) {
                                          if (b <= bad_index && bad_index < e)
                                            throw std::runtime_error("chunk failed");
                                        }),
                      "chunk failed");
    std::atomic<int64_t> sum{0};
    tpu::parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) { sum += range_sum(b, e); });
    CHECK(sum.load() == range_sum(0, 1000));
  }
}

TEST_CASE("thread pool: parallel_team runs its members together and the barrier orders phases", "[core][pool]") {
  for (int threads : {1, 2}) {
    ThreadsGuard g(threads);
    for (int rep = 0; rep < 200; ++rep) {
      std::vector<std::atomic<int>> slot(8);
      std::atomic<int> bad{0}, members{0}, team_seen{0};
      tpu::parallel_team(4, [&](int t, int team, tpu::Barrier& bar) {
        ++members;
        team_seen = team;
        for (int phase = 1; phase <= 5; ++phase) {
          slot[static_cast<size_t>(t)].store(phase);
          bar.arrive_and_wait();
          // After the first barrier every member has written this phase; none writes the
          // next one before the second barrier, which needs every member's reads done.
          for (int o = 0; o < team; ++o)
            if (slot[static_cast<size_t>(o)].load() != phase) ++bad;
          bar.arrive_and_wait();
        }
      });
      REQUIRE(bad.load() == 0);
      REQUIRE(members.load() == team_seen.load());
      REQUIRE(team_seen.load() >= 1);
      REQUIRE(team_seen.load() <= threads);
    }
  }
  // Inside a parallel region a team is the calling thread alone.
  ThreadsGuard g(2);
  std::atomic<int> inner_team{0};
  tpu::parallel_for(0, 2, 1, [&](int64_t, int64_t) {
    tpu::parallel_team(2, [&](int, int team, tpu::Barrier& bar) {
      bar.arrive_and_wait();
      inner_team = team;
    });
  });
  CHECK(inner_team.load() == 1);
}

TEST_CASE("thread pool: idle workers sleep instead of spinning", "[core][pool]") {
  ThreadsGuard g(2);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 200; ++job)
    tpu::parallel_for(0, 64, 1, [&](int64_t b, int64_t e) { sum += range_sum(b, e); });
  REQUIRE(sum.load() == 200 * range_sum(0, 64));
  // 200 ms of idleness must cost (far) less CPU time than a spinning worker would burn.
  const double c0 = process_cpu_s();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(process_cpu_s() - c0 < 0.05);
}

TEST_CASE("few-row products: the caller's blocks from the front, the others' from the back, each once",
          "[core][pool]") {
  ThreadsGuard g(2);
  const std::thread::id caller = std::this_thread::get_id();
  for (int64_t blocks = 1; blocks <= 300; blocks += 7) {
    std::vector<std::atomic<int>> seen(static_cast<size_t>(blocks));
    std::vector<std::atomic<int>> by_caller(static_cast<size_t>(blocks));
    tpu::kernels::detail::gemv_for_blocks(blocks, 1, [&](int64_t b0, int64_t b1) {
      const bool mine = std::this_thread::get_id() == caller;
      for (int64_t b = b0; b < b1; ++b) {
        ++seen[static_cast<size_t>(b)];
        if (mine) ++by_caller[static_cast<size_t>(b)];
      }
    });
    int64_t prefix = 0;  // the caller's blocks: [0, prefix)
    while (prefix < blocks && by_caller[static_cast<size_t>(prefix)].load() == 1) ++prefix;
    for (int64_t b = 0; b < blocks; ++b) {
      INFO("blocks " << blocks << " block " << b);
      REQUIRE(seen[static_cast<size_t>(b)].load() == 1);
      REQUIRE(by_caller[static_cast<size_t>(b)].load() == (b < prefix ? 1 : 0));
    }
  }
}

TEST_CASE("few-row products: the weight read next the last time", "[core][pool]") {
  // Addresses only (never read): a decode step reads a, b, c; the next step a, b, c again.
  static char w[3][64];
  const void *a = w[0], *b = w[1], *c = w[2];
  using tpu::detail::follow_weight;
  std::thread([&] {  // a thread of its own: the history is per calling thread
    CHECK(follow_weight(a, 10).p == nullptr);
    CHECK(follow_weight(b, 20).p == nullptr);
    CHECK(follow_weight(c, 30).p == nullptr);
    const auto after_a = follow_weight(a, 10);
    CHECK(after_a.p == b);
    CHECK(after_a.bytes == 20);
    CHECK(follow_weight(b, 20).p == c);
    CHECK(follow_weight(c, 30).p == a);  // c was followed by a
    CHECK(follow_weight(c, 30).p == a);  // c twice in a row does not follow itself
  }).join();
}

TEST_CASE("few-row products: an idle prefetch of memory unmapped meanwhile never faults", "[core][pool]") {
  ThreadsGuard g(2);
  const size_t bytes = size_t{1} << 20;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  REQUIRE(munmap(p, bytes) == 0);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 50; ++job)
    tpu::kernels::detail::gemv_for_blocks(
        64, 1, [&](int64_t b0, int64_t b1) { sum += range_sum(b0, b1); }, tpu::detail::NextWeight{p, bytes});
  REQUIRE(sum.load() == 50 * range_sum(0, 64));
}
