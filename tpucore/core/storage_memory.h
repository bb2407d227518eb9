// Freeing and refilling a storage's memory in place: the Storage object (and every tensor
// viewing it, e.g. ones autograd saved for backward) stays alive while its memory is given back
// to the driver, and later gets fresh memory of the same or another size. fully_shard uses it
// for the gathered parameters between a unit's forward and its backward.
#pragma once

#include <cstddef>

#include "tpucore/core/storage.h"

namespace tpu {

/// Gives the storage's memory back to its driver now; nbytes becomes 0 until refill_memory().
/// Reading a tensor on it meanwhile is a bug of the caller (its data pointer is null).
inline void free_memory(Storage& s) {
  if (s.deleter) s.deleter(s.ctx, s.data, s.nbytes);
  s.data = nullptr;
  s.nbytes = 0;
  s.deleter = nullptr;
  s.ctx = nullptr;
}

/// Whether the storage holds memory (false after free_memory() of a non-empty storage).
inline bool has_memory(const Storage& s) { return s.data != nullptr || s.nbytes == 0; }

/// New, uninitialised memory of `nbytes` on the storage's device from its driver (memory still
/// held is freed first). The version counter is kept, so autograd sees no write.
inline void refill_memory(Storage& s, size_t nbytes) {
  free_memory(s);
  StoragePtr fresh = allocate_storage(s.device, nbytes);
  s.data = fresh->data;
  s.nbytes = fresh->nbytes;
  s.deleter = fresh->deleter;
  s.ctx = fresh->ctx;
  // The fresh block's memory now belongs to `s`: `fresh` frees nothing.
  fresh->data = nullptr;
  fresh->nbytes = 0;
  fresh->deleter = nullptr;
  fresh->ctx = nullptr;
}

}  // namespace tpu
