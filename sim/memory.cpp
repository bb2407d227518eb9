#include "sim/memory.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace tpu::sim {

Memory::Memory(Space space, uint64_t bytes) : space_(space), size_(bytes) {
  if (space == Space::vmem) {
    flat_.reset(static_cast<uint8_t*>(std::calloc(bytes, 1)));
    if (!flat_) throw std::bad_alloc();
  } else {
    pages_.resize((bytes + kPageBytes - 1) / kPageBytes);
  }
}

uint8_t* Memory::page_for_write(uint64_t page) {
  auto& p = pages_[page];
  if (!p) {
    p.reset(static_cast<uint8_t*>(std::calloc(kPageBytes, 1)));
    if (!p) throw std::bad_alloc();
  }
  return p.get();
}

void Memory::read(uint64_t addr, void* dst, uint64_t n) const {
  auto* out = static_cast<uint8_t*>(dst);
  if (flat_) {
    std::memmove(out, flat_.get() + addr, n);
    return;
  }
  while (n > 0) {
    uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
    uint64_t len = std::min(n, kPageBytes - off);
    if (pages_[page]) std::memcpy(out, pages_[page].get() + off, len);
    else std::memset(out, 0, len);
    out += len;
    addr += len;
    n -= len;
  }
}

void Memory::write(uint64_t addr, const void* src, uint64_t n) {
  auto* in = static_cast<const uint8_t*>(src);
  if (flat_) {
    std::memmove(flat_.get() + addr, in, n);
    return;
  }
  while (n > 0) {
    uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
    uint64_t len = std::min(n, kPageBytes - off);
    std::memcpy(page_for_write(page) + off, in, len);
    in += len;
    addr += len;
    n -= len;
  }
}

void Memory::fill(uint64_t addr, uint8_t value, uint64_t n) {
  if (flat_) {
    std::memset(flat_.get() + addr, value, n);
    return;
  }
  while (n > 0) {
    uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
    uint64_t len = std::min(n, kPageBytes - off);
    if (value != 0 || pages_[page]) std::memset(page_for_write(page) + off, value, len);
    addr += len;
    n -= len;
  }
}

uint64_t Memory::resident_bytes() const {
  if (flat_) return size_;
  uint64_t n = 0;
  for (const auto& p : pages_) n += p ? kPageBytes : 0;
  return n;
}

}  // namespace tpu::sim
