// The serving engine's KV-cache manager: owns the block pool (BlockAllocator) and the prefix
// hashes, and gives requests their blocks. A request's block table maps its logical blocks
// (block_size positions each) to physical blocks; blocks go back to the pool when it finishes,
// is cancelled or is preempted.
//
// Prefix caching (optional): a full block is registered under the chain hash of its tokens and
// of every token before it (tokens and parent hash are checked on a hit). A request starting
// with a known prefix shares (reference count + 1) the cached blocks of its longest matching
// prefix, leaving at least its last token to compute; shared blocks are never written again.
// A cached block whose count falls to 0 stays findable on the free list until the allocator
// hands it out again.
//
// Sliding window (set_window, for models whose every layer attends over the last `window`
// positions, as Mistral): once a request's computed positions pass a block's window, no later
// query reads it, so the block goes back to the pool and its table entry becomes -1 (a
// released block; the attention kernels start at the window and never read one). A request
// then holds about window / block_size + 1 blocks however long it grows.
#pragma once

#include <cstdint>

#include "tpucore/serve/paged_cache.h"
#include "tpucore/serve/request.h"

namespace tpu::serve {

class KVCacheManager {
 public:
  KVCacheManager(int64_t num_blocks, int64_t block_size, bool prefix_caching);
  // Starts a request that holds no blocks: shares the cached blocks of its longest known prefix
  // (r.table, r.computed, r.hashed, r.last_hash set accordingly); returns the reused positions.
  int64_t share_prefix(Request& r);
  // Blocks still to allocate for r to hold `positions` positions.
  int64_t blocks_needed(const Request& r, int64_t positions) const;
  // Allocates r's blocks up to `positions`; false when the pool ran out (r keeps what it got).
  bool allocate(Request& r, int64_t positions);
  // Registers r's newly completed full blocks in the prefix cache (after a step wrote them),
  // then (with a window) releases the blocks wholly before the window of r's next position.
  void cache_full_blocks(Request& r);
  // The sliding window of every layer (0: none, every block is kept).
  void set_window(int64_t window) { window_ = window; }
  // Returns r's blocks past those holding `positions` positions to the pool (rejected
  // speculative positions); r.computed must not exceed `positions`.
  void trim(Request& r, int64_t positions);
  // Returns every block of r to the pool; r then holds nothing in the cache.
  void free(Request& r);
  int64_t block_size() const { return block_size_; }
  int64_t num_free() const { return blocks_.num_free(); }
  int64_t num_used() const { return blocks_.num_used(); }

 private:
  BlockAllocator blocks_;
  int64_t block_size_;
  bool prefix_caching_;
  int64_t window_ = 0;
};

}  // namespace tpu::serve
