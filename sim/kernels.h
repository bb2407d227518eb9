// Internal: functional kernels of the compute units, on resolved VMEM matrices. Callers have
// already bounds- and alignment-checked every operand.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "sim/isa.h"

namespace tpu::sim::detail {

// A resolved matrix operand: element (r, c) is at base + (r*rs + c*cs) * dtype_size.
struct MatRef {
  uint8_t* base = nullptr;
  DType dtype = DType::f32;
  int64_t rs = 0, cs = 1;
  bool is_imm = false;
  float imm = 0;
};

// MXU weight buffers (double-buffered) of one MXU.
struct MxuWeights {
  std::array<std::vector<float>, 2> w;  // k x n, row-major, already in the MXU's input numerics
  std::array<int64_t, 2> k{0, 0}, n{0, 0};
  std::array<MxuMode, 2> mode{MxuMode::bf16, MxuMode::bf16};
  int current = -1;   // buffer the next matmul uses
  uint64_t loads = 0; // number of weight loads so far (next load goes to buffer loads % 2)
};

void mxu_load(MxuWeights& st, int buf, const MatRef& w, int64_t k, int64_t n, MxuMode mode);
void mxu_matmul(const MxuWeights& st, const MatRef& out, const MatRef& lhs, int64_t m, bool acc, MxuMode mode,
                std::vector<float>& scratch_a, std::vector<float>& scratch_c);

void vector_exec(Op op, const MatRef& dst, const MatRef& a, const MatRef& b, const MatRef& c, int64_t rows,
                 int64_t cols, float fill_value);
void xlu_exec(Op op, const MatRef& dst, const MatRef& a, int64_t rows, int64_t cols, int axis);

}  // namespace tpu::sim::detail
