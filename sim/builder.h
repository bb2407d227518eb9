// ProgramBuilder: the C++ way to write programs (codegen uses it). Each method appends one
// instruction and returns its index; finish() finalizes (validates) the program.
//
//   ProgramBuilder b("copy");
//   b.loop(0, 4);                                   // r0 = 0..3
//   b.dma(B::vmem_at(B::at(0, {{0, 1024}})), B::hbm_at(B::at(0, {{0, 1024}})), {.row_bytes = 1024}, 0, 0);
//   b.wait(0);
//   b.end_loop();
//   Program p = b.finish();
#pragma once
#include <initializer_list>
#include <string>

#include "sim/program.h"

namespace tpu::sim {

struct DmaShape {
  int64_t planes = 1, rows = 1, row_bytes = 0;
  int64_t dst_plane_stride = -1, dst_row_stride = -1;  // bytes; -1 = dense
  int64_t src_plane_stride = -1, src_row_stride = -1;
};

class ProgramBuilder {
 public:
  explicit ProgramBuilder(std::string name = {});

  // Operand helpers. Addresses are bytes: offset + sum(reg * scale).
  static Addr at(int64_t offset, std::initializer_list<AddrTerm> terms = {});
  static Operand vmem(Addr a, DType t, int64_t row_stride = -1, int64_t col_stride = 1);
  static Operand vmem_at(Addr a);  // DMA endpoint (no dtype)
  static Operand hbm_at(Addr a);
  static Operand imm(float v);

  // Scalar unit and control flow.
  size_t nop();
  size_t halt();
  size_t sset(int reg, int64_t value);
  size_t sadd(int reg, int src, int64_t value);  // reg = src + value
  size_t smul(int reg, int src, int64_t value);  // reg = src * value
  size_t smod(int reg, int src, int64_t modulus);  // reg = src mod modulus (in [0, modulus))
  size_t loop(int reg, int64_t trip_count);  // reg counts 0 .. trip_count-1
  size_t end_loop();  // closes loop or loop_reg
  // Data-driven control: reg counts 0 .. (value of count_reg at entry) - 1 (none when <= 0).
  size_t loop_reg(int reg, int count_reg);
  // reg = the signed 32-bit word at src (hbm_at / vmem_at; 4-byte aligned).
  size_t sload(int reg, const Operand& src);
  size_t wait(int sem, int64_t amount = 1);
  size_t signal(int sem, int64_t amount = 1);
  size_t fence();

  // DMA from src to dst (either space), on DMA queue `queue`; signals `sem` (if >= 0) on completion.
  size_t dma(const Operand& dst, const Operand& src, const DmaShape& shape, int queue = 0, int sem = -1);

  // MXU: load a k x n weight tile (row stride in elements in w) into the MXU's spare weight
  // buffer; then stream m rows of an m x k LHS, writing or accumulating an m x n result.
  size_t mxu_load_weights(int mxu, const Operand& w, int64_t k, int64_t n, MxuMode mode = MxuMode::bf16);
  size_t mxu_matmul(int mxu, const Operand& out, const Operand& lhs, int64_t m, int64_t k, int64_t n, bool accumulate,
                    MxuMode mode = MxuMode::bf16);

  // Vector unit, transcendental path and cross-lane unit on rows x cols regions.
  size_t binary(Op op, const Operand& dst, const Operand& a, const Operand& b, int64_t rows, int64_t cols);
  size_t ternary(Op op, const Operand& dst, const Operand& a, const Operand& b, const Operand& c, int64_t rows,
                 int64_t cols);
  size_t unary(Op op, const Operand& dst, const Operand& a, int64_t rows, int64_t cols);  // incl. vcast, vexp...
  size_t fill(const Operand& dst, float value, int64_t rows, int64_t cols);
  size_t reduce(Op op, const Operand& dst, const Operand& a, int64_t rows, int64_t cols, int axis = 1);
  size_t transpose(const Operand& dst, const Operand& a, int64_t rows, int64_t cols);

  size_t emit(const Instr& in);
  size_t size() const { return prog_.code.size(); }
  // Finalizes and returns the program; throws SimError naming the offending instruction.
  Program finish();

 private:
  Program prog_;
};

}  // namespace tpu::sim
