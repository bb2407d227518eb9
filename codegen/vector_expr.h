// VecExpr: a straight-line program of vector-unit and transcendental operations on tiles (f32
// arithmetic, as the chip computes). It is the body of eager elementwise kernels, of fused
// elementwise regions and of matmul epilogues; op lowering rules append to it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/builder.h"

namespace tpu::codegen {

struct VecRef {
  enum class Kind : uint8_t { input, temp, imm };
  Kind kind = Kind::imm;
  int index = 0;    // input number or step number
  float value = 0;  // imm
};

struct VecStep {
  sim::Op op = sim::Op::vmov;
  std::array<VecRef, 3> src{};
  int nsrc = 0;
  // The step's f32 result is rounded to bf16 (nearest even), as a cast the user wrote does in
  // eager; the op is vmov.
  bool round_bf16 = false;
};

struct VecExpr {
  int num_inputs = 0;
  std::vector<VecStep> steps{};  // step i produces temp i
  VecRef result{};
  // Results 1.. of an expression with several outputs (a fused region that materializes more
  // than one value); empty for the usual single result.
  std::vector<VecRef> extra_results{};

  VecRef input(int i);
  static VecRef imm(float v) { return {VecRef::Kind::imm, 0, v}; }
  VecRef op(sim::Op o, VecRef a);
  VecRef op(sim::Op o, VecRef a, VecRef b);
  VecRef op(sim::Op o, VecRef a, VecRef b, VecRef c);
  // `a` rounded to bf16 (kept in f32). A value already rounded (or an immediate that is a
  // bf16 value) comes back unchanged.
  VecRef round_bf16(VecRef a);
  std::string key() const;  // structural text for program cache keys
};

// Compositions of ISA operations (shared by op rules and fused regions).
VecRef vec_sigmoid(VecExpr& e, VecRef x);
VecRef vec_silu(VecExpr& e, VecRef x);
VecRef vec_gelu(VecExpr& e, VecRef x, bool tanh_approx);
VecRef vec_not(VecExpr& e, VecRef x);  // 1 - x for 0/1 masks

// Where the tile temporaries live: `slots` buffers of `slot_bytes` at `base` in VMEM, each a
// dense f32 matrix with row stride `ld` elements.
struct TempArena {
  int64_t base = 0, slot_bytes = 0, ld = 0;
  int slots = 0;
};

// f32 temporaries the expression needs for a tile (with reuse by liveness), counting one per
// input whose storage dtype the vector unit cannot read (integers and bools are cast first).
int vec_temp_slots(const VecExpr& e, const std::vector<sim::DType>& input_dtypes);

// Emits the expression over a rows x cols tile whose inputs are `inputs` (VMEM operands, any
// strides) and stores the result into `dst` (f32/bf16 directly, other dtypes through vcast).
void emit_vec_expr(sim::ProgramBuilder& b, const VecExpr& e, const std::vector<sim::Operand>& inputs,
                   const sim::Operand& dst, const TempArena& arena, int64_t rows, int64_t cols);
// The same for an expression with several results: result k (0: `e.result`, then
// `e.extra_results`) is stored into dsts[k]. A step whose value is a result is written straight
// into its destination when that is f32 (later steps read it there) or, for bf16, when no later
// step reads it; otherwise it stays in its f32 temporary and is converted at the end.
void emit_vec_expr(sim::ProgramBuilder& b, const VecExpr& e, const std::vector<sim::Operand>& inputs,
                   const std::vector<sim::Operand>& dsts, const TempArena& arena, int64_t rows, int64_t cols);

inline bool vpu_readable(sim::DType t) { return t == sim::DType::f32 || t == sim::DType::bf16; }

}  // namespace tpu::codegen
