// Decode attention over a KV cache up to its live length, given at run time: the attention of a
// compiled decode step. The step's shapes are those of the whole cache (capacity C, so one
// trace serves every position), but only the keys [0, pos + 1) are live. This op takes the
// write position as a one-element integer tensor (the one kv_cache_write_ used) and reads only
// the live keys:
//
//   kv_cache_attention(q [B, H, 1, D], k_cache / v_cache [B, Hkv, C, D], pos, mask, scale)
//     = scaled_dot_product_attention(q, k[:, :, :pos+1], v[:, :, :pos+1], mask[..., :pos+1])
//
// mask (optional): bool, broadcastable to [B, H, 1, C] (true = takes part).
//
// On `sim` (and `tpu:N` devices that run generated programs) one program serves every
// position: per batch row, its query heads are query rows (the group of each KV head together,
// as in decode_attention.h, so each cached key and value is read once per step); the keys and
// values of every KV head stream through VMEM in steps of tk keys by DMA (double-buffered: step
// i + 1 is fetched during step i, a row's last step fetches the next row's queries and first
// step) in a loop counted by a scalar register (`loopr`, the number of live steps); the live
// length itself comes from the position tensor in HBM (a DMA of its low word, cast to f32 in
// VMEM) and masks the keys of the last step past it. S = Q K^T and O += P V per KV head on the
// MXUs, online softmax on the vector unit and the EUP. A query row whose every live key is
// masked gives an average of cached values (the masked scores are finite), not NaN as on the
// cpu. Shapes the program does not take (more than one query, a mask that differs between
// heads, other dtypes) run as scaled_dot_product_attention over the narrowed cache (a program
// per length).
#pragma once

#include <cstdint>
#include <string>

#include "sim/config.h"
#include "sim/isa.h"
#include "sim/program.h"
#include "tpucore/core/tensor.h"

namespace tpu::codegen {

struct CachedAttentionSpec {
  int64_t batch = 1, heads = 1, kv_heads = 1, head_dim = 1, capacity = 1;
  int64_t tk = 0;  // keys per step: a power of two dividing capacity (0: chosen)
  float scale = 1;
  sim::DType dtype = sim::DType::f32;
  sim::MxuMode mode = sim::MxuMode::f32;
  bool has_mask = false;
  int64_t mask_batch_stride = 0;  // bytes between the batch rows' masks (0: one mask for all)
  int64_t window = 0;  // sliding window: keys at positions <= pos - window are masked (0: none)
  float softcap = 0;   // scores -> softcap * tanh(scale S / softcap) before the softmax (0: none)
};

// Arguments (r0..r6): q [B, H, 1, D] contiguous, k cache, v cache [B, Hkv, C, D] contiguous,
// out [B, H, 1, D] contiguous (all of dtype), the mask bytes (a [C] row per batch row, or
// anything when there is none), the number of live steps ceil((pos + 1) / tk), the HBM address
// of the position (its low 32-bit word is read).
sim::Program make_cached_attention_program(const sim::ChipConfig& cfg, const CachedAttentionSpec& s);
std::string cached_attention_key(const CachedAttentionSpec& s);
// tk for this chip: about two MXU widths of keys per step, a power of two dividing the capacity,
// shrunk to fit VMEM.
int64_t choose_cached_attention_tk(const sim::ChipConfig& cfg, const CachedAttentionSpec& s);
int64_t cached_attention_vmem_bytes(const sim::ChipConfig& cfg, const CachedAttentionSpec& s);

// q: [B, H, T, D]; k_cache, v_cache: [B, Hkv, C, D] of q's dtype and device (H a multiple of
// Hkv); pos: one i32/i64 value with 0 <= pos <= C - T (the keys [0, pos + T) are live: the
// cache was written at pos); mask: undefined or bool broadcastable to [B, H, T, C]. Bad input is
// a tpu::Error naming it. window > 0: query i (position pos + i) sees only the keys at
// (pos + i - window, pos + i] (a sliding window); softcap > 0: the scaled scores are soft-capped,
// softcap * tanh(scores / softcap), before the mask and softmax (Gemma). On the chip both are
// constants of the program (no host work for the mask).
Tensor kv_cache_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                          const Tensor& mask, double scale, int64_t window = 0, double softcap = 0);

// The fused flash attention (attention_kernel.h) of q [..., Lq, D] over k, v [..., Lk, D] on a
// device that runs generated programs, into `out` [..., Lq, Dv]: an optional bool mask
// broadcastable to the scores, causal (top-left), a sliding window with query row i at key
// position q_pos0 + i, soft-capping, all program constants. False (nothing run) for shapes and
// dtypes it does not take (not f32 / bf16, no keys, causal with q_pos0 != 0).
bool flash_attention_on_chip(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& out,
                             double scale, bool causal = false, int64_t window = 0, int64_t q_pos0 = 0,
                             double softcap = 0);

}  // namespace tpu::codegen
