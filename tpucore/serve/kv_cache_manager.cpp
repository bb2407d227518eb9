#include "tpucore/serve/kv_cache_manager.h"

#include <algorithm>

namespace tpu::serve {

KVCacheManager::KVCacheManager(int64_t num_blocks, int64_t block_size, bool prefix_caching)
    : blocks_(num_blocks), block_size_(block_size), prefix_caching_(prefix_caching) {}

int64_t KVCacheManager::share_prefix(Request& r) {
  const int64_t bs = block_size_, len = static_cast<int64_t>(r.tokens.size());
  uint64_t h = 0;
  for (int64_t j = 0; prefix_caching_ && (j + 1) * bs < len; ++j) {  // one token is left to compute
    std::vector<int64_t> blk(r.tokens.begin() + j * bs, r.tokens.begin() + (j + 1) * bs);
    const uint64_t hh = BlockAllocator::chain_hash(h, blk.data(), bs);
    const int32_t b = blocks_.find_cached(hh, h, blk);
    if (b < 0) break;
    blocks_.share(b);
    r.table.push_back(b);
    h = hh;
  }
  r.hashed = static_cast<int64_t>(r.table.size());
  r.computed = r.hashed * bs;
  r.last_hash = h;
  return r.computed;
}

int64_t KVCacheManager::blocks_needed(const Request& r, int64_t positions) const {
  const int64_t need = (positions + block_size_ - 1) / block_size_ - static_cast<int64_t>(r.table.size());
  return need > 0 ? need : 0;
}

bool KVCacheManager::allocate(Request& r, int64_t positions) {
  const int64_t need = (positions + block_size_ - 1) / block_size_;
  while (static_cast<int64_t>(r.table.size()) < need) {
    const int32_t b = blocks_.allocate();
    if (b < 0) return false;
    r.table.push_back(b);
  }
  return true;
}

void KVCacheManager::cache_full_blocks(Request& r) {
  const int64_t bs = block_size_;
  while (prefix_caching_ && (r.hashed + 1) * bs <= r.computed) {
    std::vector<int64_t> blk(r.tokens.begin() + r.hashed * bs, r.tokens.begin() + (r.hashed + 1) * bs);
    const uint64_t hh = BlockAllocator::chain_hash(r.last_hash, blk.data(), bs);
    blocks_.register_cached(r.table[static_cast<size_t>(r.hashed)], hh, r.last_hash, std::move(blk));
    r.last_hash = hh;
    r.hashed++;
  }
  // The next query (position r.computed) sees keys from r.computed - window + 1 on: block j is
  // out of every later window once its last position (j + 1) * bs - 1 lies before that.
  if (window_ <= 0) return;
  const int64_t first_kept = std::min<int64_t>((r.computed - window_ + 1) / bs, static_cast<int64_t>(r.table.size()));
  for (int64_t j = 0; j < first_kept; ++j) {
    int32_t& b = r.table[static_cast<size_t>(j)];
    if (b < 0) continue;
    blocks_.free(b);
    b = -1;
  }
}

void KVCacheManager::trim(Request& r, int64_t positions) {
  const auto keep = static_cast<size_t>((positions + block_size_ - 1) / block_size_);
  while (r.table.size() > keep) {
    if (r.table.back() >= 0) blocks_.free(r.table.back());
    r.table.pop_back();
  }
}

void KVCacheManager::free(Request& r) {
  for (int32_t b : r.table)
    if (b >= 0) blocks_.free(b);  // -1: released behind the window
  r.table.clear();
  r.computed = 0;
  r.hashed = 0;
  r.last_hash = 0;
}

}  // namespace tpu::serve
