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
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "tpucore/kernel.h"

namespace examples {

inline tpu::kernel::KernelDef paged_decode_attention_kernel(int64_t batch, int64_t heads, int64_t kv_heads,
                                                            int64_t head_dim, int64_t page, int64_t max_pages,
                                                            double scale, int64_t pages_per_step = 0,
                                                            int64_t buffers = 3) {
  using namespace tpu::kernel;
  const int64_t group = heads / kv_heads, d = head_dim;
  // Pages per compute step: about 128 keys (one MXU width) unless given.
  const int64_t pps = pages_per_step > 0 ? pages_per_step : std::max<int64_t>(1, 128 / page), keys = pps * page;
  const int nbuf = static_cast<int>(std::max<int64_t>(2, buffers));
  KernelDef k;
  k.name = "paged_decode_attention";
  k.grid = {batch, kv_heads};
  k.num_scalar_prefetch = 2;  // block tables, lengths
  k.num_semaphores = 2 * nbuf;  // K and V of each buffer slot
  k.in_specs = {
      {.block_shape = {group, d}, .index_map = [kv_heads](auto g) { return Index{g[0] * kv_heads + g[1], 0}; },
       .name = "q"},
      {.name = "k_cache", .memory = MemorySpace::any},
      {.name = "v_cache", .memory = MemorySpace::any},
  };
  k.out_specs = {{.block_shape = {group, d},
                  .index_map = [kv_heads](auto g) { return Index{g[0] * kv_heads + g[1], 0}; }, .name = "o"}};
  for (const char* kv : {"k", "v"})
    for (int s = 0; s < nbuf; ++s) k.scratch.push_back({.shape = {keys, d}, .name = kv + std::to_string(s)});
  k.scratch.push_back({.shape = {1, keys}, .name = "key_index"});  // 0 .. keys - 1, made once
  k.body = [=](KernelContext& c) {
    constexpr double kMasked = -1e30;
    const int64_t b = c.program_id(0), h = c.program_id(1);
    Ref key_index = c.scratch(2 * nbuf);
    if (b == 0 && h == 0) key_index.store(cast(iota({1, keys}, 1), tpu::DType::f32));
    // Every compute step of the kernel, in grid order: (sequence, KV head, step of its pages).
    // Compute step n uses buffer slot n % nbuf; its copies start nbuf - 1 compute steps ahead,
    // across grid steps too (the semaphores' FIFO order matches starts and waits).
    std::vector<std::array<int64_t, 3>> all;
    size_t base = 0;
    for (int64_t e = 0; e < batch; ++e)
      for (int64_t eh = 0; eh < kv_heads; ++eh) {
        if (e == b && eh == h) base = all.size();
        for (int64_t i = 0; i * keys < c.scalar(1, e); ++i) all.push_back({e, eh, i});
      }
    const int64_t len = c.scalar(1, b), steps = (len + keys - 1) / keys;
    if (steps == 0) return;  // an empty sequence: its rows stay zero
    // The K and V copies of compute step n, each page into its window of the slot's buffers.
    auto for_pages = [&](size_t n, auto&& f) {
      const auto [sb, sh, i] = all[n];
      const int s = static_cast<int>(n % static_cast<size_t>(nbuf));
      const int64_t pages = (c.scalar(1, sb) + page - 1) / page;
      for (int64_t j = i * pps; j < std::min(pages, (i + 1) * pps); ++j) {
        const int64_t first = c.scalar(0, sb * max_pages + j) * page, at = (j - i * pps) * page;
        f(c.async_copy(c.in(1).at({first, sh * d}, {page, d}), c.scratch(s).at({at, 0}, {page, d}), s));
        f(c.async_copy(c.in(2).at({first, sh * d}, {page, d}), c.scratch(nbuf + s).at({at, 0}, {page, d}), nbuf + s));
      }
    };
    auto start = [](const AsyncCopy& cp) { cp.start(); };
    auto wait = [](const AsyncCopy& cp) { cp.wait(); };
    const size_t ahead = static_cast<size_t>(nbuf - 1);
    if (base == 0)
      for (size_t n = 0; n < std::min(ahead, all.size()); ++n) for_pages(n, start);
    const Value q = c.in(0).load() * scale;
    Value m = full({group, 1}, kMasked), l = full({group, 1}, 0.0), acc = full({group, d}, 0.0);
    for (int64_t i = 0; i < steps; ++i) {
      const size_t n = base + static_cast<size_t>(i);
      const int s = static_cast<int>(n % static_cast<size_t>(nbuf));
      if (n + ahead < all.size()) for_pages(n + ahead, start);  // later pages come in while these are computed
      for_pages(n, wait);
      Value scores = dot(q, c.scratch(s).load(), {.transpose_b = true});  // [group, keys]
      const int64_t valid = std::min(keys, len - i * keys);  // keys past the sequence's end are masked
      if (valid < keys) scores = where(lt(key_index.load(), static_cast<double>(valid)), scores, kMasked);
      const Value m_new = maximum(m, row_max(scores));
      const Value p = exp(scores - m_new), alpha = exp(m - m_new);
      l = alpha * l + row_sum(p);
      acc = alpha * acc + dot(p, c.scratch(nbuf + s).load());
      m = m_new;
    }
    c.out(0).store(acc / l);
  };
  return k;
}

}  // namespace examples
