// Flash attention forward written with the kernel API: o = softmax(q k^T * scale) v for q, k, v
// of shape [H, S, D] (heads flattened into H), optionally causal. The grid runs over (heads,
// query blocks, key blocks); each step computes the scores of a query block against a key
// block on the MXU, and the online softmax keeps a running row max m, a running row sum l and
// an unnormalized output in scratch, rescaling them as the max grows; the last key step stores
// acc / l. Scores never leave vector memory. Masked scores (the causal upper triangle, keys past
// a ragged end) are a large negative number rather than -inf, so a block whose scores are all
// masked for a row adds nothing instead of NaN.
#pragma once

#include <cmath>

#include "tpucore/kernel.h"

namespace examples {

inline tpu::kernel::KernelDef flash_attention_kernel(std::span<const tpu::kernel::TensorType> in,
                                                      std::span<const tpu::kernel::TensorType>,
                                                      const tpu::kernel::Params& params) {
  using namespace tpu::kernel;
  const int64_t h = in[0].shape[0], s = in[0].shape[1], d = in[0].shape[2], sk = in[1].shape[1];
  auto get = [&](const char* name, int64_t dflt) {
    auto it = params.find(name);
    return it == params.end() ? dflt : it->second;
  };
  const int64_t bq = get("bq", 128), bk = get("bk", 128);
  KernelDef k;
  k.name = "flash_attention";
  k.grid = {h, (s + bq - 1) / bq, (sk + bk - 1) / bk};
  k.in_specs = {
      {.block_shape = {squeezed, bq, d}, .index_map = [](auto g) { return Index{g[0], g[1], 0}; }, .name = "q"},
      {.block_shape = {squeezed, bk, d}, .index_map = [](auto g) { return Index{g[0], g[2], 0}; }, .name = "k"},
      {.block_shape = {squeezed, bk, d}, .index_map = [](auto g) { return Index{g[0], g[2], 0}; }, .name = "v"},
  };
  k.out_specs = {{.block_shape = {squeezed, bq, d}, .index_map = [](auto g) { return Index{g[0], g[1], 0}; }, .name = "o"}};
  k.scratch = {{.shape = {bq, 1}, .name = "m"}, {.shape = {bq, 1}, .name = "l"}, {.shape = {bq, d}, .name = "acc"}};
  k.params = {{"causal", get("causal", 0)}};
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  k.body = [scale](KernelContext& c) {
    constexpr double kMasked = -1e30;
    Ref m = c.scratch(0), l = c.scratch(1), acc = c.scratch(2);
    const bool causal = c.param("causal") != 0;
    Ref q = c.in(0), kk = c.in(1), v = c.in(2);
    // A key block entirely above the causal diagonal of this query block adds nothing: skipped.
    if (causal && kk.offset(0) > q.offset(0) + q.shape()[0] - 1) {
      if (c.program_id(2) + 1 == c.num_programs(2)) c.out(0).store(acc.load() / l.load());
      return;
    }
    if (c.program_id(2) == 0) {
      m.store(full(m.shape(), kMasked));
      l.store(full(l.shape(), 0.0));
      acc.store(full(acc.shape(), 0.0));
    }
    Value sc = dot(q.load(), kk.load(), {.transpose_b = true}) * scale;
    const std::vector<int64_t> ss = sc.shape();
    Value col = cast(iota(ss, 1), tpu::DType::f32) + static_cast<double>(kk.offset(0));
    Value keep = lt(col, static_cast<double>(kk.offset(0) + kk.valid(0)));  // keys past a ragged end
    if (causal) keep = logical_and(keep, le(col, cast(iota(ss, 0), tpu::DType::f32) + static_cast<double>(q.offset(0))));
    sc = where(keep, sc, kMasked);
    Value m_prev = m.load();
    Value m_new = maximum(m_prev, row_max(sc));
    Value p = exp(sc - m_new);
    Value alpha = exp(m_prev - m_new);
    l.store(alpha * l.load() + row_sum(p));
    acc.store(alpha * acc.load() + dot(p, v.load()));
    m.store(m_new);
    if (c.program_id(2) + 1 == c.num_programs(2)) c.out(0).store(acc.load() / l.load());
  };
  return k;
}

// Registers the kernel as the op "flash_attention" (once per process): q, k, v [H, S, D] -> o of
// q's shape and dtype; parameters bq, bk (block sizes) and causal.
inline const tpu::kernel::Op& flash_attention_op() {
  using namespace tpu::kernel;
  static const Op op = register_op({
      .name = "flash_attention",
      .num_inputs = 3,
      .output_types =
          [](std::span<const TensorType> in, const Params&) {
            TPU_CHECK(in[0].shape.ndim() == 3 && in[1].shape == in[2].shape && in[1].shape.ndim() == 3 &&
                          in[0].shape[0] == in[1].shape[0] && in[0].shape[2] == in[1].shape[2],
                      "flash_attention: expected q [H, S, D], k and v [H, Sk, D], got {}, {}, {}", in[0].shape,
                      in[1].shape, in[2].shape);
            return std::vector<TensorType>{in[0]};
          },
      .kernel = flash_attention_kernel,
      .doc = "softmax(q k^T / sqrt(D)) v as a flash-attention kernel",
  });
  return op;
}

}  // namespace examples
