/// @file
/// Caching host allocator: size-binned free lists so eager ops reuse freed buffers instead
/// of page-faulting fresh mappings. Buffers are 64-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tpu {

struct HostAllocatorStats {
  size_t bytes_in_use = 0;    ///< handed out, not yet returned (binned sizes)
  size_t bytes_cached = 0;    ///< returned and kept for reuse
  size_t peak_in_use = 0;
  uint64_t allocations = 0;   ///< calls to allocate
  uint64_t cache_hits = 0;    ///< served from the cache
};

void* host_allocate(size_t nbytes);
void host_free(void* p, size_t nbytes);
HostAllocatorStats host_allocator_stats();
void host_reset_peak();
/// Returns all cached blocks to the system.
void host_empty_cache();
/// Cap on cached bytes (default 2 GiB; TPU_HOST_CACHE_MB overrides); beyond it, freed blocks go
/// back to the system.
void host_set_cache_limit(size_t bytes);

}  // namespace tpu
