// Ragged paged decode attention written with the kernel API in manual mode: every sequence b
// brings one query token (heads H, head dim D) and holds lens[b] positions in a paged KV cache
// (pages of `page` positions; page j of sequence b is block_tables[b, j]). The caches
// [num_pages * page, kv_heads * D] stay in HBM (MemorySpace::any), in the layout of the
// library's serving caches; the block tables and the lengths are scalar-prefetch arrays. The
// grid runs over (sequences, KV heads); a step walks its sequence's pages with double-buffered
// async copies (page j + 1's K and V are in flight while page j is computed) and an online
// softmax over the query heads sharing the KV head: scores on the MXU, the ragged tail of the
// last page masked, the running max, sum and unnormalized output rescaled as the max grows.
//
// Inputs: block_tables i32 [B, max_pages], lens i32 [B], q [B * H, D] (query head hq of sequence
// b in row b * H + hq; hq uses KV head hq / (H / kv_heads)), k_cache, v_cache. Output [B * H, D].
#pragma once

#include <cmath>

#include "tpucore/kernel.h"

namespace examples {

inline tpu::kernel::KernelDef paged_decode_attention_kernel(int64_t batch, int64_t heads, int64_t kv_heads,
                                                            int64_t head_dim, int64_t page, int64_t max_pages,
                                                            double scale, tpu::DType dtype = tpu::DType::f32) {
  using namespace tpu::kernel;
  const int64_t group = heads / kv_heads, d = head_dim;
  KernelDef k;
  k.name = "paged_decode_attention";
  k.grid = {batch, kv_heads};
  k.num_scalar_prefetch = 2;  // block tables, lengths
  k.num_semaphores = 4;       // K and V of two page slots
  k.in_specs = {
      {.block_shape = {group, d}, .index_map = [kv_heads](auto g) { return Index{g[0] * kv_heads + g[1], 0}; },
       .name = "q"},
      {.name = "k_cache", .memory = MemorySpace::any},
      {.name = "v_cache", .memory = MemorySpace::any},
  };
  k.out_specs = {{.block_shape = {group, d},
                  .index_map = [kv_heads](auto g) { return Index{g[0] * kv_heads + g[1], 0}; }, .name = "o"}};
  for (const char* n : {"k0", "k1", "v0", "v1"}) k.scratch.push_back({.shape = {page, d}, .dtype = dtype, .name = n});
  k.body = [=](KernelContext& c) {
    constexpr double kMasked = -1e30;
    const int64_t b = c.program_id(0), h = c.program_id(1);
    const int64_t len = c.scalar(1, b), pages = (len + page - 1) / page;
    if (pages == 0) return;  // an empty sequence: its rows stay zero
    // The K and V copies of page j of this sequence into slot s.
    auto copies = [&](int64_t j, int s) {
      const int64_t first = c.scalar(0, b * max_pages + j) * page;
      return std::pair{c.async_copy(c.in(1).at({first, h * d}, {page, d}), c.scratch(s), s),
                       c.async_copy(c.in(2).at({first, h * d}, {page, d}), c.scratch(2 + s), 2 + s)};
    };
    auto [k0, v0] = copies(0, 0);
    k0.start();
    v0.start();
    const Value q = cast(c.in(0).load(), tpu::DType::f32) * scale;
    Value m = full({group, 1}, kMasked), l = full({group, 1}, 0.0), acc = full({group, d}, 0.0);
    for (int64_t j = 0; j < pages; ++j) {
      const int s = static_cast<int>(j % 2);
      if (j + 1 < pages) {  // the next page comes in while this one is computed
        auto [kn, vn] = copies(j + 1, 1 - s);
        kn.start();
        vn.start();
      }
      auto [kc, vc] = copies(j, s);
      kc.wait();
      vc.wait();
      Value scores = dot(q, cast(c.scratch(s).load(), tpu::DType::f32), {.transpose_b = true});
      const int64_t valid = std::min(page, len - j * page);
      if (valid < page) scores = where(lt(iota({group, page}, 1), static_cast<double>(valid)), scores, kMasked);
      const Value m_new = maximum(m, row_max(scores));
      const Value p = exp(scores - m_new), alpha = exp(m - m_new);
      l = alpha * l + row_sum(p);
      acc = alpha * acc + dot(p, cast(c.scratch(2 + s).load(), tpu::DType::f32));
      m = m_new;
    }
    c.out(0).store(acc / l);
  };
  return k;
}

}  // namespace examples
