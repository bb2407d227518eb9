// The cpu linear_int4 op's cache of weights repacked to the panel layout of the vnni kernel
// (ops/cpu/kernels/gemv_int4.h, gemv_int4_panels). The canonical packed int4 weight (read by
// every other path: the chip program, save / load, sharding, export) stays as it is; the cache
// holds a second copy per weight, built on its first few-row product.
//
// An entry is keyed by the weight's and the scales' storages (weak references: an entry whose
// storage died is dropped on the next lookup, and a storage's identity is never confused with a
// later one at the same address), their version counters (bumped by every in-place write through
// a tensor op, so a written weight is repacked), offsets, shapes, the group and the scales'
// dtype. The cache holds at most TPU_CPU_INT4_REPACK_MB megabytes (default 2048; 0 turns it off):
// when a weight does not fit, it is not cached and its products read the canonical layout in
// place (entries of live weights are never evicted for it, so a model larger than the budget
// does not repack over and over). Scales that reach the kernel as a fresh copy on every call (a
// dtype the kernel casts, such as bf16) are seen as such after one miss and not cached. Thread
// safe.
#pragma once

#include <cstdint>
#include <memory>

#include "tpucore/core/tensor.h"

namespace tpu::ops {

// The repacked form of one weight: int4_panel_bytes(N, K, group, f16_scales) bytes.
struct Int4Panels {
  uint8_t* data = nullptr;
  int64_t bytes = 0;
  bool f16_scales = false;
  Int4Panels() = default;
  Int4Panels(const Int4Panels&) = delete;
  Int4Panels& operator=(const Int4Panels&) = delete;
  ~Int4Panels();
};

// The panels of the packed weight q [N, K / 2] (u8, cpu, contiguous) with scales s [N, K / group]
// (f32 or f16, contiguous), from the cache or repacked now; null when the panel kernel is not
// available (no AVX-512 VNNI), the weight does not fit in the budget or is not cacheable.
std::shared_ptr<const Int4Panels> int4_panels_for(const Tensor& q, const Tensor& s, int64_t group);

struct Int4RepackStats {
  int64_t entries = 0;    // cached weights (live ones, after dropping the dead)
  int64_t bytes = 0;      // their bytes
  int64_t cap_bytes = 0;  // the budget
};
Int4RepackStats int4_repack_stats();

// Sets the budget in megabytes (tests), overriding TPU_CPU_INT4_REPACK_MB; a negative value
// returns to the variable's. Entries over the new budget are not dropped (0 drops them all).
void set_int4_repack_cap_mb(int64_t mb);

}  // namespace tpu::ops
