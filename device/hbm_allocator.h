// HbmAllocator: device-memory bookkeeping for a chip whose memory is addressed by byte
// offsets (the simulated HBM). Best fit over a free list ordered by size, neighbouring free
// blocks coalesce on free, every block is aligned to `alignment` bytes. Thread-safe. It only
// does arithmetic on addresses; it never touches the memory itself.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

namespace tpu::device {

struct HbmAllocatorStats {
  uint64_t capacity = 0;       // bytes managed
  uint64_t bytes_in_use = 0;   // sum of live block sizes (rounded up to the alignment)
  uint64_t bytes_free = 0;     // capacity - bytes_in_use
  uint64_t largest_free = 0;   // largest single free block
  uint64_t peak_in_use = 0;
  uint64_t live_blocks = 0;
  uint64_t allocations = 0;    // successful allocate() calls
  uint64_t failures = 0;       // allocate() calls that found no block
};

class HbmAllocator {
 public:
  // Manages [base, base + capacity). `alignment` must be a power of two; base is rounded up.
  HbmAllocator(uint64_t base, uint64_t capacity, uint64_t alignment = 512);
  HbmAllocator(const HbmAllocator&) = delete;
  HbmAllocator& operator=(const HbmAllocator&) = delete;

  // The address of a block of at least `bytes` bytes (0 counts as 1), or nullopt when no free
  // block is large enough.
  std::optional<uint64_t> allocate(uint64_t bytes);
  // Returns a block; false if `addr` is not the start of a live block (nothing changes).
  bool free(uint64_t addr);
  // Size of the live block starting at addr (0 if none).
  uint64_t block_size(uint64_t addr) const;
  // True when [addr, addr + n) lies inside one live block.
  bool in_live_block(uint64_t addr, uint64_t n) const;

  HbmAllocatorStats stats() const;
  uint64_t bytes_free() const { return stats().bytes_free; }
  uint64_t alignment() const { return align_; }
  uint64_t round_up(uint64_t bytes) const;

 private:
  void insert_free(uint64_t addr, uint64_t size);
  void erase_free(std::map<uint64_t, uint64_t>::iterator it);

  mutable std::mutex mu_;
  uint64_t base_, capacity_, align_;
  std::map<uint64_t, uint64_t> free_by_addr_;            // addr -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (size, addr): best fit = lower_bound
  std::map<uint64_t, uint64_t> used_;                     // addr -> size
  uint64_t in_use_ = 0, peak_ = 0, allocations_ = 0, failures_ = 0;
};

}  // namespace tpu::device
