/// Prefetching on a pool thread's idle time (tpucore/core/parallel.h's pool).
///
/// A few-row product of a decode step reads its weight from the last-level cache; between two
/// products the caller runs the small serial ops (norms, attention, RoPE) while the other pool
/// threads wait. A kernel running on a pool worker can name, before its chunk returns, a byte
/// range that the worker then prefetches into its caches while it waits for the next job,
/// stopping as soon as a job arrives. Prefetch instructions never fault, so a range whose memory
/// was freed meanwhile costs cache space, never correctness.
#pragma once

#include <cstddef>

namespace tpu::detail {

/// On a pool worker inside a chunk: after the chunk, prefetch [p, p + bytes) (replaces an earlier
/// request of this chunk). Ignored on the calling thread and outside a pool chunk.
void prefetch_after_chunk(const void* p, size_t bytes);

/// The weight a few-row product read right after `w` the last time the calling thread ran `w`
/// (keys and values are addresses, never dereferenced here), and records that `w` (of `bytes`)
/// follows the product this thread ran before it. {nullptr, 0} when not known.
struct NextWeight {
  const void* p = nullptr;
  size_t bytes = 0;
};
NextWeight follow_weight(const void* w, size_t bytes);

}  // namespace tpu::detail
