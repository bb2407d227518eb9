/// @file
/// Caching host allocator: size-binned free lists so eager ops reuse freed buffers instead
/// of page-faulting fresh mappings. Buffers are 64-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tpu {

/// Counters of the caching host allocator (host_allocator_stats()).
struct HostAllocatorStats {
  size_t bytes_in_use = 0;    ///< handed out, not yet returned (binned sizes)
  size_t bytes_cached = 0;    ///< returned and kept for reuse
  /// Highest bytes_in_use since the start or host_reset_peak().
  size_t peak_in_use = 0;
  uint64_t allocations = 0;   ///< calls to allocate
  uint64_t cache_hits = 0;    ///< served from the cache
};

/// A 64-byte aligned block of at least `nbytes` (reused from the cache when one fits); throws
/// tpu::Error when the system is out of memory.
void* host_allocate(size_t nbytes);
/// Returns a block from host_allocate() (with the same `nbytes`) to the cache.
void host_free(void* p, size_t nbytes);
/// The current counters.
HostAllocatorStats host_allocator_stats();
/// Restarts peak_in_use from the current bytes_in_use.
void host_reset_peak();
/// Returns all cached blocks to the system.
void host_empty_cache();
/// Cap on cached bytes (default 2 GiB; TPU_HOST_CACHE_MB overrides); beyond it, freed blocks go
/// back to the system.
void host_set_cache_limit(size_t bytes);

}  // namespace tpu
