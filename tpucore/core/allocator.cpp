#include "tpucore/core/allocator.h"

#include "tpucore/core/env.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#include "tpucore/core/error.h"

namespace tpu {
namespace {

constexpr size_t kAlign = 64;
constexpr int kBins = 64 * 4;

// Bin of a size: sizes round up to 64 bytes, then to the next of 4 steps per power of two
// (1, 1.25, 1.5, 1.75 x 2^k), so rounding wastes at most 25%.
struct Bin {
  int index;
  size_t bytes;
};

Bin bin_for(size_t n) {
  if (n < kAlign) n = kAlign;
  int k = 63 - __builtin_clzll(n);  // 2^k <= n
  if (k < 8) {  // below 256 bytes: multiples of 64
    size_t b = (n + kAlign - 1) / kAlign * kAlign;
    return {static_cast<int>(b / kAlign), b};
  }
  size_t base = size_t{1} << k, step = base / 4;
  size_t q = (n - base + step - 1) / step;  // 0..4
  size_t b = base + q * step;
  return {8 + (k - 8) * 4 + static_cast<int>(q) + 8, b};  // offset past the small bins
}

struct Cache {
  std::mutex mu;
  std::vector<void*> free_lists[kBins + 16];
  HostAllocatorStats st;
  size_t limit = 0;
  Cache() {
    size_t mb = 2048;
    if (auto v = env_int("TPU_HOST_CACHE_MB", 0, int64_t{1} << 30, "keeping the default of 2048 MiB"))
      mb = static_cast<size_t>(*v);
    limit = mb << 20;
  }
  ~Cache() { release_all(); }
  void release_all() {
    for (auto& l : free_lists) {
      for (void* p : l) std::free(p);
      l.clear();
    }
    st.bytes_cached = 0;
  }
};

Cache& cache() {
  static Cache* c = new Cache();  // leaked on purpose: tensors may outlive static destruction
  return *c;
}

}  // namespace

void* host_allocate(size_t nbytes) {
  Bin b = bin_for(nbytes);
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lk(c.mu);
    ++c.st.allocations;
    auto& l = c.free_lists[b.index];
    if (!l.empty()) {
      void* p = l.back();
      l.pop_back();
      c.st.bytes_cached -= b.bytes;
      c.st.bytes_in_use += b.bytes;
      if (c.st.bytes_in_use > c.st.peak_in_use) c.st.peak_in_use = c.st.bytes_in_use;
      ++c.st.cache_hits;
      return p;
    }
  }
  void* p = std::aligned_alloc(kAlign, b.bytes);
  if (!p) {
    // Give the cache back and try once more before failing.
    {
      std::lock_guard<std::mutex> lk(c.mu);
      c.release_all();
    }
    p = std::aligned_alloc(kAlign, b.bytes);
    TPU_CHECK(p != nullptr, "cpu: out of host memory allocating {} bytes", nbytes);
  }
  std::lock_guard<std::mutex> lk(c.mu);
  c.st.bytes_in_use += b.bytes;
  if (c.st.bytes_in_use > c.st.peak_in_use) c.st.peak_in_use = c.st.bytes_in_use;
  return p;
}

void host_free(void* p, size_t nbytes) {
  if (!p) return;
  Bin b = bin_for(nbytes);
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.mu);
  c.st.bytes_in_use -= b.bytes;
  if (c.st.bytes_cached + b.bytes <= c.limit) {
    c.free_lists[b.index].push_back(p);
    c.st.bytes_cached += b.bytes;
  } else {
    std::free(p);
  }
}

HostAllocatorStats host_allocator_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.mu);
  return c.st;
}

void host_reset_peak() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.mu);
  c.st.peak_in_use = c.st.bytes_in_use;
}

void host_empty_cache() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.mu);
  c.release_all();
}

void host_set_cache_limit(size_t bytes) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.mu);
  c.limit = bytes;
}

}  // namespace tpu
