// Ragged paged decode attention written with the kernel API in manual mode: every sequence b
// brings one query token (heads H, head dim D) and holds lens[b] positions in a paged KV cache
// (pages of `page` positions; page j of sequence b is block_tables[b, j]). The caches
// [num_pages * page, kv_heads * D] stay in HBM (MemorySpace::any), in the layout of the
// library's serving caches; the block tables and the lengths are scalar-prefetch arrays. The
// grid runs over (sequences, KV heads); a step walks its sequence's pages `pages_per_step` at a
// time (about one MXU width of keys), each page copied by an async copy into its window of a
// K and a V buffer, double-buffered (the next pages are in flight while these are computed),
// with an online softmax over the query heads sharing the KV head: scores on the MXU, keys past
// the sequence's end masked, the running max, sum and unnormalized output rescaled as the max
// grows. f32 caches.
//
// Inputs: block_tables i32 [B, max_pages], lens i32 [B], q [B * H, D] (query head hq of sequence
// b in row b * H + hq; hq uses KV head hq / (H / kv_heads)), k_cache, v_cache. Output [B * H, D].
#pragma once

#include <algorithm>
#include <cmath>

#include "tpucore/kernel.h"

namespace examples {

inline tpu::kernel::KernelDef paged_decode_attention_kernel(int64_t batch, int64_t heads, int64_t kv_heads,
                                                            int64_t head_dim, int64_t page, int64_t max_pages,
                                                            double scale, int64_t pages_per_step = 0) {
  using namespace tpu::kernel;
  const int64_t group = heads / kv_heads, d = head_dim;
  // Pages per compute step: about 128 keys (one MXU width) unless given.
  const int64_t pps = pages_per_step > 0 ? pages_per_step : std::max<int64_t>(1, 128 / page), keys = pps * page;
  KernelDef k;
  k.name = "paged_decode_attention";
  k.grid = {batch, kv_heads};
  k.num_scalar_prefetch = 2;  // block tables, lengths
  k.num_semaphores = 4;       // K and V of two buffer slots
  k.in_specs = {
      {.block_shape = {group, d}, .index_map = [kv_heads](auto g) { return Index{g[0] * kv_heads + g[1], 0}; },
       .name = "q"},
      {.name = "k_cache", .memory = MemorySpace::any},
      {.name = "v_cache", .memory = MemorySpace::any},
  };
  k.out_specs = {{.block_shape = {group, d},
                  .index_map = [kv_heads](auto g) { return Index{g[0] * kv_heads + g[1], 0}; }, .name = "o"}};
  for (const char* n : {"k0", "k1", "v0", "v1"}) k.scratch.push_back({.shape = {keys, d}, .name = n});
  k.scratch.push_back({.shape = {1, keys}, .name = "key_index"});  // 0 .. keys - 1, made once
  k.body = [=](KernelContext& c) {
    constexpr double kMasked = -1e30;
    const int64_t b = c.program_id(0), h = c.program_id(1);
    auto steps_of = [&](int64_t seq) { return (c.scalar(1, seq) + keys - 1) / keys; };
    const int64_t len = c.scalar(1, b), pages = (len + page - 1) / page, steps = steps_of(b);
    if (b == 0 && h == 0) c.scratch(4).store(cast(iota({1, keys}, 1), tpu::DType::f32));
    if (pages == 0) return;  // an empty sequence: its rows stay zero
    // Compute steps run over the grid in one sequence, alternating between two buffer slots:
    // this grid step's first one is number `base` (the steps of the grid steps before it).
    int64_t base = 0;
    for (int64_t e = 0; e < b; ++e) base += kv_heads * steps_of(e);
    base += h * steps;
    // The K and V copies of compute step i of sequence sb, KV head sh into buffer slot s (K on
    // semaphore s, V on 2 + s), each page into its window of the buffer.
    auto for_pages = [&](int64_t sb, int64_t sh, int64_t i, int s, auto&& f) {
      const int64_t n = (c.scalar(1, sb) + page - 1) / page;
      for (int64_t j = i * pps; j < std::min(n, (i + 1) * pps); ++j) {
        const int64_t first = c.scalar(0, sb * max_pages + j) * page, at = (j - i * pps) * page;
        f(c.async_copy(c.in(1).at({first, sh * d}, {page, d}), c.scratch(s).at({at, 0}, {page, d}), s));
        f(c.async_copy(c.in(2).at({first, sh * d}, {page, d}), c.scratch(2 + s).at({at, 0}, {page, d}), 2 + s));
      }
    };
    auto start = [](const AsyncCopy& cp) { cp.start(); };
    auto wait = [](const AsyncCopy& cp) { cp.wait(); };
    // The first grid step with pages starts its own first copies; the others find them in flight,
    // started by the grid step before (its last compute step prefetches the next one's first).
    bool first_busy = true;
    for (int64_t e = 0; e < b && first_busy; ++e) first_busy = steps_of(e) == 0;
    if (first_busy && h == 0) for_pages(b, h, 0, static_cast<int>(base % 2), start);
    const Value q = c.in(0).load() * scale;
    Value m = full({group, 1}, kMasked), l = full({group, 1}, 0.0), acc = full({group, d}, 0.0);
    for (int64_t i = 0; i < steps; ++i) {
      const int s = static_cast<int>((base + i) % 2);
      if (i + 1 < steps) {
        for_pages(b, h, i + 1, 1 - s, start);  // the next pages come in while these are computed
      } else {  // the next grid step with pages: its first compute step
        int64_t nb = h + 1 < kv_heads ? b : b + 1, nh = h + 1 < kv_heads ? h + 1 : 0;
        while (nb < batch && steps_of(nb) == 0) ++nb;
        if (nb < batch) for_pages(nb, nh, 0, 1 - s, start);
      }
      for_pages(b, h, i, s, wait);
      Value scores = dot(q, c.scratch(s).load(), {.transpose_b = true});  // [group, keys]
      const int64_t valid = std::min(keys, len - i * keys);  // keys past the sequence's end are masked
      if (valid < keys) scores = where(lt(c.scratch(4).load(), static_cast<double>(valid)), scores, kMasked);
      const Value m_new = maximum(m, row_max(scores));
      const Value p = exp(scores - m_new), alpha = exp(m - m_new);
      l = alpha * l + row_sum(p);
      acc = alpha * acc + dot(p, c.scratch(2 + s).load());
      m = m_new;
    }
    c.out(0).store(acc / l);
  };
  return k;
}

}  // namespace examples
