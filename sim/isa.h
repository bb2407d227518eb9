// The instruction set of the simulated TensorCore. One flat `Instr` struct carries every
// field an opcode may use; `op_info()` says which unit executes an opcode and how it is
// written in assembly. The ISA is documented as a table in sim/README.md.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "sim/types.h"

namespace tpu::sim {

enum class Op : uint8_t {
  // scalar unit / control
  nop, halt, sset, sadd, smul, smod, loop, endloop, wait, signal, fence,
  // DMA engines
  dma,
  // MXU
  mxu_lw, mxu_mm,
  // vector unit: binary, ternary, unary, fill, cast
  vadd, vsub, vmul, vdiv, vmax, vmin, vcmplt, vcmple, vcmpeq,
  vfma, vsel,
  vmov, vneg, vabs, vfill, vcast,
  // transcendental path
  vexp, vlog, vtanh, vrsqrt, vrecip, verf, vsqrt,
  // cross-lane unit
  xsum, xmax, xtrans,
  // scalar unit, data-driven: a 32-bit load into a register, a loop counted by a register
  sld, loopr,
  // vector unit, 32-bit integer: bitwise and / or / xor, shift left, shift right logical /
  // arithmetic (i32 operands; shift counts 0..31)
  vand, vor, vxor, vshl, vshrl, vshra,
  count_
};

enum class UnitKind : uint8_t { scalar, dma, mxu_weights, mxu, vpu, eup, xlu };

// Assembly field layout of an opcode.
enum class Format : uint8_t {
  none, sset, sadd, loop, sem, dma, mxu_lw, mxu_mm, vbinary, vternary, vunary, vfill, xreduce, xtrans,
  sld, loopr
};

struct OpInfo {
  std::string_view name;
  UnitKind unit;
  Format format;
};
const OpInfo& op_info(Op op);
std::optional<Op> op_from_name(std::string_view name);
// The 32-bit integer vector ops (vand ... vshra): i32 operands, or immediates that are integers.
bool is_int_vector_op(Op op);

// bf16: inputs rounded to bf16, one pass (f32 accumulate). f32: f32 inputs, products as exact as
// six bf16 passes make them (XLA's HIGHEST), at f32_cycles_per_row. i8: exact integers.
// bf16x3: f32 inputs split into bf16 hi + lo, three passes (hi*hi + hi*lo + lo*hi; XLA's HIGH).
// fp8: e4m3 inputs at fp8_cycles_per_row, f32 accumulation (a chip without an fp8 rate refuses
// the mode). Float inputs to the i8 / fp8 modes are converted on the way in as bf16 mode rounds
// f32 ones: i8 rounds to the nearest integer (ties to even) saturating to [-128, 127], fp8
// rounds to e4m3 saturating to +-448. i8 mode accumulates into i32 (exact, wrapping) or f32
// outputs. bf16 / bf16x3 weights may be i8 or f8e4m3: their values are exact in bf16 (weights
// widened as they load).
enum class MxuMode : uint8_t { bf16, f32, i8, bf16x3, fp8 };
std::string_view mxu_mode_name(MxuMode m);
std::optional<MxuMode> parse_mxu_mode(std::string_view s);

// An affine byte address: offset + sum(reg[i] * scale[i]). Loop counters and scalar
// registers make one instruction in a loop body touch a different tile each iteration.
struct AddrTerm {
  int16_t reg = -1;  // -1: unused
  int64_t scale = 0;
  bool operator==(const AddrTerm&) const = default;
};
struct Addr {
  int64_t offset = 0;
  std::array<AddrTerm, 3> terms{};
  bool operator==(const Addr&) const = default;
};

// A memory operand: a rows x cols matrix of `dtype` at `addr` in `space`, with row and column
// strides in elements (0 = broadcast). Or an f32 immediate (vector-op sources only).
struct Operand {
  enum class Kind : uint8_t { none, mem, imm };
  Kind kind = Kind::none;
  Space space = Space::vmem;
  DType dtype = DType::f32;
  Addr addr{};
  int64_t row_stride = -1;  // -1: default (dense rows), filled in by Program::finalize
  int64_t col_stride = 1;
  float imm = 0;
  bool operator==(const Operand& o) const;
};

struct Instr {
  Op op = Op::nop;
  int32_t unit = 0;     // mxu index (mxu.*) or DMA queue (dma)
  int32_t sem = -1;     // semaphore: wait/signal, and the one a DMA signals on completion
  int32_t reg = -1;     // destination / loop counter register
  int32_t reg_a = -1;   // sadd source register
  int64_t imm = 0;      // sset/sadd immediate, loop trip count, wait/signal amount
  float fimm = 0;       // vfill value
  Operand dst, a, b, c;  // dma: dst <- a; mxu.lw: weights a; mxu.mm: dst (out) <- a (lhs)
  int64_t rows = 0, cols = 0;  // vector ops: shape; mxu.mm: m, n; mxu.lw: k (rows), n (cols)
  int64_t k = 0;               // mxu.mm contraction depth
  int32_t axis = 1;            // xsum/xmax: 1 = reduce each row, 0 = reduce each column
  MxuMode mode = MxuMode::bf16;
  bool acc = false;            // mxu.mm: accumulate into out (else overwrite)
  std::array<int64_t, 3> dma_shape{1, 1, 0};  // [planes, rows, contiguous bytes per row]
  std::array<int64_t, 2> dst_stride{-1, -1};  // bytes between planes, rows (-1: dense)
  std::array<int64_t, 2> src_stride{-1, -1};
  int32_t match = -1;          // loop <-> endloop partner (filled by Program::finalize)
  bool operator==(const Instr& o) const;
};

// Logical matrix shape (rows, cols) of an instruction's operand; {0,0} if the slot is unused.
enum class Role : uint8_t { dst, a, b, c };
std::array<int64_t, 2> operand_shape(const Instr& in, Role r);

}  // namespace tpu::sim
