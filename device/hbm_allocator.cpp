#include "device/hbm_allocator.h"

namespace tpu::device {

HbmAllocator::HbmAllocator(uint64_t base, uint64_t capacity, uint64_t alignment) : align_(alignment) {
  if (align_ == 0 || (align_ & (align_ - 1)) != 0) align_ = 512;
  const uint64_t end = base + capacity;
  base_ = (base + align_ - 1) & ~(align_ - 1);
  capacity_ = end > base_ ? ((end - base_) & ~(align_ - 1)) : 0;
  if (capacity_) insert_free(base_, capacity_);
}

uint64_t HbmAllocator::round_up(uint64_t bytes) const {
  if (bytes == 0) bytes = 1;
  if (bytes > UINT64_MAX - align_) return UINT64_MAX & ~(align_ - 1);
  return (bytes + align_ - 1) & ~(align_ - 1);
}

void HbmAllocator::insert_free(uint64_t addr, uint64_t size) {
  free_by_addr_.emplace(addr, size);
  free_by_size_.emplace(size, addr);
}

void HbmAllocator::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_addr_.erase(it);
}

std::optional<uint64_t> HbmAllocator::allocate(uint64_t bytes) {
  const uint64_t need = round_up(bytes);
  std::lock_guard<std::mutex> lk(mu_);
  auto fit = free_by_size_.lower_bound({need, 0});
  if (fit == free_by_size_.end()) {
    ++failures_;
    return std::nullopt;
  }
  const uint64_t size = fit->first, addr = fit->second;
  erase_free(free_by_addr_.find(addr));
  if (size > need) insert_free(addr + need, size - need);
  used_.emplace(addr, need);
  in_use_ += need;
  if (in_use_ > peak_) peak_ = in_use_;
  ++allocations_;
  return addr;
}

bool HbmAllocator::free(uint64_t addr) {
  std::lock_guard<std::mutex> lk(mu_);
  auto u = used_.find(addr);
  if (u == used_.end()) return false;
  uint64_t start = addr, size = u->second;
  in_use_ -= size;
  used_.erase(u);
  // Coalesce with the free neighbours on both sides.
  auto next = free_by_addr_.lower_bound(addr);
  if (next != free_by_addr_.end() && next->first == addr + size) {
    size += next->second;
    auto n2 = std::next(next);
    erase_free(next);
    next = n2;
  }
  if (next != free_by_addr_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      erase_free(prev);
    }
  }
  insert_free(start, size);
  return true;
}

uint64_t HbmAllocator::block_size(uint64_t addr) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto u = used_.find(addr);
  return u == used_.end() ? 0 : u->second;
}

bool HbmAllocator::in_live_block(uint64_t addr, uint64_t n) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = used_.upper_bound(addr);
  if (it == used_.begin()) return false;
  --it;
  return addr - it->first <= it->second && n <= it->second - (addr - it->first);
}

HbmAllocatorStats HbmAllocator::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  HbmAllocatorStats s;
  s.capacity = capacity_;
  s.bytes_in_use = in_use_;
  s.bytes_free = capacity_ - in_use_;
  s.largest_free = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  s.peak_in_use = peak_;
  s.live_blocks = used_.size();
  s.allocations = allocations_;
  s.failures = failures_;
  return s;
}

}  // namespace tpu::device
