// A tiled matmul with a fused epilogue written with the kernel API: y = act(x w + b) for
// x [M, K], w [K, N], b [N]. The grid runs over (M blocks, N blocks, K blocks); each step
// multiplies an x block by a w block on the MXU and adds the product to an f32 accumulator in
// scratch memory; the last K step adds the bias, applies the activation and stores the block.
// Ragged edges need no special code: blocks past the end of x and w load as zeros (so they add
// nothing to the products) and the store writes only the elements inside y.
#pragma once

#include "tpucore/kernel.h"

namespace examples {

// Activation of the epilogue (the "act" parameter).
enum class Act : int64_t { none = 0, relu = 1, silu = 2 };

inline tpu::kernel::KernelDef matmul_epilogue_kernel(std::span<const tpu::kernel::TensorType> in,
                                                      std::span<const tpu::kernel::TensorType> out,
                                                      const tpu::kernel::Params& params) {
  using namespace tpu::kernel;
  const int64_t m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
  auto get = [&](const char* name, int64_t dflt) {
    auto it = params.find(name);
    return it == params.end() ? dflt : it->second;
  };
  const int64_t bm = get("bm", 128), bn = get("bn", 128), bk = get("bk", 128);
  KernelDef d;
  d.name = "matmul_epilogue";
  d.grid = {(m + bm - 1) / bm, (n + bn - 1) / bn, (k + bk - 1) / bk};
  d.in_specs = {
      {.block_shape = {bm, bk}, .index_map = [](auto g) { return Index{g[0], g[2]}; }, .name = "x"},
      {.block_shape = {bk, bn}, .index_map = [](auto g) { return Index{g[2], g[1]}; }, .name = "w"},
      {.block_shape = {bn}, .index_map = [](auto g) { return Index{g[1]}; }, .name = "b"},
  };
  d.out_specs = {{.block_shape = {bm, bn}, .index_map = [](auto g) { return Index{g[0], g[1]}; }, .name = "y"}};
  d.scratch = {{.shape = {bm, bn}, .dtype = tpu::DType::f32, .name = "acc"}};
  d.params = {{"act", get("act", 0)}};
  (void)out;
  d.body = [](KernelContext& c) {
    Ref acc = c.scratch(0);
    if (c.program_id(2) == 0) acc.store(full(acc.shape(), 0.0));
    acc.store(acc.load() + dot(c.in(0).load(), c.in(1).load()));
    if (c.program_id(2) + 1 < c.num_programs(2)) return;
    Value y = acc.load() + cast(c.in(2).load(), tpu::DType::f32);  // the bias row broadcasts over the rows
    switch (static_cast<Act>(c.param("act"))) {
      case Act::relu: y = relu(y); break;
      case Act::silu: y = y * sigmoid(y); break;
      case Act::none: break;
    }
    c.out(0).store(y);
  };
  return d;
}

// Registers the kernel as the op "matmul_epilogue" (once per process): inputs x, w, b; output of
// x's dtype; parameters bm, bn, bk (block sizes) and act.
inline const tpu::kernel::Op& matmul_epilogue_op() {
  using namespace tpu::kernel;
  static const Op op = register_op({
      .name = "matmul_epilogue",
      .num_inputs = 3,
      .output_types =
          [](std::span<const TensorType> in, const Params&) {
            TPU_CHECK(in[0].shape.ndim() == 2 && in[1].shape.ndim() == 2 && in[2].shape.ndim() == 1,
                      "matmul_epilogue: expected x [M, K], w [K, N], b [N], got {}, {}, {}", in[0].shape, in[1].shape,
                      in[2].shape);
            TPU_CHECK(in[0].shape[1] == in[1].shape[0] && in[1].shape[1] == in[2].shape[0],
                      "matmul_epilogue: sizes differ: x {}, w {}, b {}", in[0].shape, in[1].shape, in[2].shape);
            return std::vector<TensorType>{{tpu::Shape{in[0].shape[0], in[1].shape[1]}, in[0].dtype}};
          },
      .kernel = matmul_epilogue_kernel,
      .doc = "act(x w + b) as a tiled kernel",
  });
  return op;
}

}  // namespace examples
