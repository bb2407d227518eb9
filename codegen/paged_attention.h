// Ragged paged attention as one chip program (the shape of vLLM's TPU ragged paged attention):
// one call per layer and serving step, over a batch of sequences that each bring any number of
// new tokens (decode tokens and prefill chunks mixed, flattened without padding), reading the
// paged KV cache through block tables, with the cache update fused in.
//
// The program is data-driven, so one program serves every step of a given model shape: the
// block tables, the sequence lengths and the new tokens' cache slots are HBM data (i32) read
// with `sld`, and the loops over tokens, work units and KV steps are counted by registers
// (`loopr`). Only the shape of the model (heads, head dim, block size), the tile sizes and the
// capacity of the work-unit table are baked in (paged_attention_key).
//
// The program, in order:
//   1. cache update: for every new token, the K row and the V row ([kv_heads * head_dim]) are
//      copied by DMA into their cache slot (slot = block * block_size + offset), then waited.
//   2. attention, per work unit: a decode unit is one sequence with one new token; a prefill
//      unit is up to `tile_tokens` consecutive new tokens of one sequence. The unit's queries
//      ([kv_heads, tokens, group, head_dim], the query heads sharing a KV head folded into rows)
//      come in by one DMA per token (q needs no padding rows past the step's tokens); its KV
//      pages stream in steps of `pages_per_step` pages (decode units: decode_pages_per_step)
//      through its page list, one DMA per page for K and one for V, into three buffers: step
//      j + 2 is fetched during step j, and a unit's last steps fetch the next unit's queries and
//      first pages. A unit reads exactly the pages that hold keys up to its last query's
//      position (a decode unit: the ceil(length / block_size) pages below its sequence's
//      length, every KV head of them, nothing else): the slots of its last step past them, and
//      the two steps past each class's last unit, are -1 in the page list and are neither
//      fetched nor waited for (their keys are masked). Per step and KV head S = Q K^T and
//      O += P V on the MXUs, the query heads of the KV head as the rows ([tokens x group,
//      head_dim] x [head_dim, keys]); the causal mask compares each key's position with the
//      query's (also masking the keys past the sequence in the last step); online softmax as in
//      attention_kernel.h, with the row sums l from P V against a ones column of V (prefill)
//      or from the cross-lane unit (decode: V's own columns only, so the MXUs load only the
//      weight tiles P V needs, and a V page is one contiguous copy). A class with no units in
//      the step skips its setup (constants, zeroed buffers). The result rows of the unit's
//      valid tokens go out by one DMA per token.
//      Per-layer variants (constants of the program): a sliding window masks the keys at
//      positions <= query position - window (every step is masked); soft-capping replaces the
//      scaled scores by softcap * tanh(scale S / softcap) on the EUP before the mask.
//
// Arguments (HBM addresses in r0..r8): q [tokens, heads, head_dim],
// k_new / v_new [tokens, kv_heads * head_dim], k_cache / v_cache [num_blocks * block_size,
// kv_heads * head_dim], out [tokens, heads, head_dim] (q, k, v, caches and out of `dtype`),
// then the i32 arrays of PagedAttentionMeta: units, pages, slots.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/config.h"
#include "sim/isa.h"
#include "sim/program.h"
#include "tpucore/core/tensor.h"

namespace tpu::codegen {

struct PagedAttentionSpec {
  int64_t heads = 1, kv_heads = 1, head_dim = 1;
  int64_t block_size = 16;
  int64_t pages_per_step = 1;  // KV pages per step of prefill units (keys per step = pages * block_size)
  int64_t decode_pages_per_step = 0;  // KV pages per step of decode units (0: pages_per_step)
  int64_t tile_tokens = 8;     // new tokens per prefill work unit
  int64_t max_units = 8;       // capacity of the work-unit table (a key of the program)
  float scale = 1;
  // Sliding window (0: none): a query at position p sees the keys at (p - window, p]. In
  // plan_paged_attention it also starts each unit's page list at the block of its first
  // query's first visible key (pages wholly before the window are never read); such a plan
  // serves only layers of this window, a plan with window 0 serves every layer.
  int64_t window = 0;
  float softcap = 0;  // scores -> softcap * tanh(scores / softcap) before the softmax (0: none)
  sim::DType dtype = sim::DType::f32;
  sim::MxuMode mode = sim::MxuMode::f32;
};

// Words of one work unit in PagedAttentionMeta::units (after a header of the same size).
inline constexpr int64_t kPagedUnitWords = 8;

// The step's data: units = header {new tokens, decode units, prefill units, 0...} then one
// record per unit {first token, tokens, first query position (counted from the first key of its
// page list: the block of its first visible key), steps, first page index, steps
// before the last that need no causal mask, the other steps before the last, 0}
// (decode units first); pages = every unit's page list (steps * pages per step block ids, the
// tail of the last step -1; after each class's last unit two more steps of -1, where the
// kernel looks ahead; -1 entries are not read); slots = the cache slot of each new token.
struct PagedAttentionMeta {
  std::vector<int32_t> units, pages, slots;
  int64_t num_units = 0, num_tokens = 0;
  int64_t kv_pages_read = 0;  // pages the attention part reads (K and V each): the entries that are not -1
};

// Builds the meta data of one step. Sequence s brings tokens [query_start[s], query_start[s+1])
// and holds context_len[s] positions after the step (its new tokens last); block_tables[s]
// covers them. A tpu::Error names what is inconsistent (offsets, lengths, a table too short, a
// block id outside [0, num_blocks), more work units than spec.max_units).
//
// Which class computes a token: without prompt_tokens, a sequence bringing one token is a
// decode unit and one bringing more is cut into prefill units. The two classes sum in different
// orders (keys per step; row sums on the MXUs or the cross-lane unit), so the same token can
// come out a rounding apart depending on how the step was cut. With prompt_tokens (one count per
// sequence: how many of its new tokens, the first ones, are prompt tokens), the class follows
// the token instead: prompt tokens go in prefill units, even a chunk of one, and every other
// token (a generated token, a speculative proposal, a recomputed generated token) in a decode
// unit of its own; with a window, a prefill unit's key steps also start on a fixed grid (its
// leading pages before the window are -1). A token's result then depends only on its
// sequence's keys (batch-invariant serving), whatever chunking, batching or speculation the
// step has.
PagedAttentionMeta plan_paged_attention(const PagedAttentionSpec& spec, int64_t num_blocks,
                                        const std::vector<int64_t>& query_start,
                                        const std::vector<int64_t>& context_len,
                                        const std::vector<const std::vector<int32_t>*>& block_tables,
                                        const std::vector<int64_t>* prompt_tokens = nullptr);
// Work units a step of these sequences needs (plan_paged_attention's classes: a decode unit per
// decode token; ceil(prompt tokens / tile) prefill units per sequence).
int64_t paged_attention_units(const PagedAttentionSpec& spec, const std::vector<int64_t>& query_start,
                              const std::vector<int64_t>* prompt_tokens = nullptr);

// Tile sizes for this chip: pages per step so a step covers about one MXU width of keys (short
// steps keep the software pipeline full; decode steps use the same), tile tokens so a prefill
// unit gives each KV head about two MXU heights of rows (shrunk to fit VMEM).
void choose_paged_attention_tiling(const sim::ChipConfig& cfg, PagedAttentionSpec& s);
int64_t paged_attention_vmem_bytes(const sim::ChipConfig& cfg, const PagedAttentionSpec& s);
// KV pages per step of decode (true) or prefill units.
inline int64_t paged_pages_per_step(const PagedAttentionSpec& s, bool decode) {
  return decode && s.decode_pages_per_step > 0 ? s.decode_pages_per_step : s.pages_per_step;
}

sim::Program make_paged_attention_program(const sim::ChipConfig& cfg, const PagedAttentionSpec& s);
std::string paged_attention_key(const PagedAttentionSpec& s);

// Runs the program on the sim device of the tensors (all on one chip, contiguous): q
// [>= tokens, heads, head_dim], k_new / v_new [>= tokens, kv_heads * head_dim], the caches [num_blocks *
// block_size, kv_heads * head_dim] (updated in place), out [>= tokens, heads, head_dim], all of
// spec.dtype; units / pages / slots: PagedAttentionMeta's arrays as i32 tensors on the chip.
// A tpu::Error names a bad shape, dtype or device.
void run_paged_attention(const PagedAttentionSpec& spec, int64_t num_tokens, const Tensor& q, const Tensor& k_new,
                         const Tensor& v_new, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                         const Tensor& units, const Tensor& pages, const Tensor& slots);

}  // namespace tpu::codegen
