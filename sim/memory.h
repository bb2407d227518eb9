// Memories of the simulated chip. HBM is sparse (pages are allocated on first write, unwritten
// bytes read as zero), so a 96 GiB HBM costs nothing until used. VMEM is one flat zeroed block.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "sim/types.h"

namespace tpu::sim {

class Memory {
 public:
  Memory(Space space, uint64_t bytes);
  Space space() const { return space_; }
  uint64_t size() const { return size_; }
  bool contains(uint64_t addr, uint64_t n) const { return addr <= size_ && n <= size_ - addr; }

  // Unchecked (callers check bounds first).
  void read(uint64_t addr, void* dst, uint64_t n) const;
  void write(uint64_t addr, const void* src, uint64_t n);
  void fill(uint64_t addr, uint8_t value, uint64_t n);
  // VMEM only: a direct pointer to the flat storage.
  uint8_t* data() { return flat_.get(); }
  const uint8_t* data() const { return flat_.get(); }
  // Host memory in use for this memory (pages actually allocated).
  uint64_t resident_bytes() const;

  static constexpr uint64_t kPageBytes = uint64_t(1) << 20;

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  uint8_t* page_for_write(uint64_t page);

  Space space_;
  uint64_t size_;
  std::unique_ptr<uint8_t, FreeDeleter> flat_;              // vmem
  std::vector<std::unique_ptr<uint8_t, FreeDeleter>> pages_;  // hbm
};

}  // namespace tpu::sim
