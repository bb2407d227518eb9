// ElementwiseKernel: the chip program of one elementwise computation (a VecExpr) over a
// row-major rows x cols output. Each input is a full rows x cols matrix, a row vector broadcast
// down the rows, a column vector broadcast along the rows, or one scalar. The domain is tiled to
// fit VMEM; each tile's inputs are DMAed in on alternating queues, computed on the vector unit,
// and stored while the next tile loads.
//
// Several outputs (a fused region materializing more than one value, e.g. an optimizer update:
// new parameter and new moments) are results of the same VecExpr over the same domain, each
// with its own dtype and double-buffered tile, stored by its own DMA after each tile.
//
// Arguments (scalar registers): r0..r(n-1) the inputs' HBM addresses, rn.. r(n+m-1) the m
// outputs'.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/vector_expr.h"
#include "sim/config.h"
#include "sim/program.h"
#include "tpucore/core/shape.h"

namespace tpu::codegen {

enum class EwLayout : uint8_t { full, row, col, scalar };

struct EwInput {
  EwLayout layout = EwLayout::full;
  sim::DType dtype = sim::DType::f32;
};

// Bytes of `in` for a rows x cols output tile as it sits in VMEM: the whole tile, one row,
// one column or one element, by its layout.
int64_t ew_tile_bytes(const EwInput& in, int64_t rows, int64_t cols);

// VMEM buffers start 64-byte aligned.
inline int64_t align64(int64_t v) { return (v + 63) / 64 * 64; }

struct ElementwiseSpec {
  std::string name;
  int64_t rows = 1, cols = 1;
  std::vector<EwInput> inputs;
  VecExpr expr;
  sim::DType out_dtype = sim::DType::f32;           // of expr.result
  std::vector<sim::DType> extra_out_dtypes{};       // of expr.extra_results (same order)

  int num_outputs() const { return 1 + int(extra_out_dtypes.size()); }
  sim::DType output_dtype(int k) const { return k == 0 ? out_dtype : extra_out_dtypes[size_t(k - 1)]; }
};

// Sets spec.rows x spec.cols for an output of shape `out`: its last dim as the columns, or,
// when every input is full or scalar, rows of one vreg width (dense tiles whatever the shape).
void fold_domain(ElementwiseSpec& spec, const Shape& out, const sim::ChipConfig& cfg);

// Scalar registers the program needs (one address per input and output, three counters), and
// whether a program with these operands fits the chip (registers, one semaphore per output).
int elementwise_registers(int inputs, int outputs);
bool elementwise_fits(const sim::ChipConfig& cfg, int inputs, int outputs);
sim::Program make_elementwise_program(const sim::ChipConfig& cfg, const ElementwiseSpec& spec);
std::string elementwise_key(const ElementwiseSpec& spec);

// Largest tile (in elements) whose buffers of `bytes_per_element` bytes in total fit the chip's
// VMEM with room to spare; at least one vreg's worth.
int64_t vmem_tile_elements(const sim::ChipConfig& cfg, int64_t bytes_per_element);

}  // namespace tpu::codegen
