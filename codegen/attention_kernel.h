// AttentionKernel: fused scaled-dot-product attention (flash-attention style) as one chip
// program. For every (query head, block of tq query rows) the key/value blocks of tk rows stream
// through VMEM by DMA (prefetched two steps ahead, three buffers each); per step
//   S = Q K^T               on the MXUs (key tiles of the array width side by side, f32 accumulate)
//   soft-cap, causal and sliding-window masks on the vector unit / EUP (the masks only on blocks
//                           that straddle the diagonal or the window's edge)
//   m' = max(m, rowmax S);  P = exp(scale (S - m'));  l' = l exp(scale (m - m')) + rowsum P
//   T = P V                 on the MXUs (query rows split over the MXUs)
//   O = O exp(scale (m - m')) + T
// and at the end of the row block O / l is rounded to the output dtype and stored. The scores
// never leave VMEM; key blocks entirely above the causal diagonal are never computed. Steps are
// software-pipelined: the MXUs compute the next step's S while the vector unit and the EUP run
// this step's softmax, and the O update of a step is emitted after the next step's matmuls.
// Row maxima and sums fold lane-wide chunks on the vector unit before one cross-lane reduction.
//
// Arguments: r0 Q, r1 K, r2 V, r3 O, r4 the mask when there is one (HBM addresses). Q/K/V rows may have any row stride (last
// dim contiguous); each head's matrix starts at its own element offset. O is contiguous
// [heads, Lq, Dv].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/config.h"
#include "sim/isa.h"
#include "sim/program.h"

namespace tpu::codegen {

struct AttentionSpec {
  std::string name = "attention";
  int64_t heads = 1;  // query heads (all batch dims folded)
  int64_t group = 1;  // query heads per key/value head: head h reads kv head h / group
  int64_t lq = 1, lk = 1, d = 1, dv = 1;
  bool causal = false;
  float scale = 1;  // > 0
  sim::DType dtype = sim::DType::bf16;  // of q, k, v and the output
  sim::MxuMode mode = sim::MxuMode::bf16;
  // Element offsets of each head's matrix and the row strides (elements).
  std::vector<int64_t> q_off, k_off, v_off;  // heads / heads / heads / group entries
  int64_t q_rs = 0, k_rs = 0, v_rs = 0;
  // Optional mask (r4): bytes of 0/1 (true = takes part), each head's [lq, lk] matrix at m_off
  // with row stride m_rs (0 broadcasts one row to every query) and contiguous keys.
  bool has_mask = false;
  std::vector<int64_t> m_off;
  int64_t m_rs = 0;
  int64_t tq = 0, tk = 0;  // 0: chosen by choose_attention_tiling
  // Sliding window (0: none): query row i, at key position q_pos0 + i, sees only the keys j with
  // q_pos0 + i - j < window; key blocks wholly before every row's window are never computed.
  // q_pos0 must be 0 with causal (top-left aligned).
  int64_t window = 0, q_pos0 = 0;
  // Soft-capping (0: none): the scaled scores become softcap * tanh(scale S / softcap) before
  // the masks and the softmax (Gemma's order).
  float softcap = 0;
};

struct AttentionTiling {
  int64_t tq = 0, tk = 0;
  int64_t vmem_bytes = 0;
};
// tk = MXUs x array width (one key tile per MXU), tq up to 4 x that; shrunk until VMEM fits.
AttentionTiling choose_attention_tiling(const sim::ChipConfig& cfg, const AttentionSpec& s);

sim::Program make_attention_program(const sim::ChipConfig& cfg, const AttentionSpec& s);
std::string attention_key(const AttentionSpec& s);

}  // namespace tpu::codegen
