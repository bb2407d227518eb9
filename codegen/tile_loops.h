// TileLoops2D: walks a rows x cols domain in tiles of up to tr x tc, emitting loops over the
// full tiles and separate code for the ragged last row/column tiles. The body is emitted once
// per tile variant with the tile's extent and the byte-address terms of its position.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "sim/builder.h"

namespace tpu::codegen {

struct TilePos {
  int64_t rows = 0, cols = 0;        // extent of this tile variant
  int64_t row0 = 0, col0 = 0;        // constant element offsets (ragged variants), else 0
  int row_reg = -1, col_reg = -1;    // registers counting full tiles (or -1)
  int64_t tile_rows = 0, tile_cols = 0;  // full tile extent (scale of the registers)

  // Address of element (row, col) of the tile in a row-major matrix with `ld` elements per row
  // of `es` bytes each, whose base is in register base_reg (or -1) plus `offset`.
  sim::Addr addr(int base_reg, int64_t offset, int64_t ld, int64_t es, bool use_rows = true, bool use_cols = true) const;
};

// Emits the tiling; registers row_reg and col_reg are used as loop counters.
void emit_tile_loops(sim::ProgramBuilder& b, int64_t rows, int64_t cols, int64_t tr, int64_t tc, int row_reg,
                     int col_reg, const std::function<void(const TilePos&)>& body);

// An f32 vector op over n contiguous values at VMEM byte address dst (a column of per-row values,
// say), shaped as full vregs of `lanes` plus a one-row tail, so it costs n / lanes vreg ops, not
// one per value. Memory sources advance and are re-strided with dst, except broadcasts (row and
// column stride 0), which stay as they are, as do immediates and scalar registers. One, two or
// three sources (unary, binary, ternary op).
void emit_dense_vec(sim::ProgramBuilder& b, int64_t lanes, sim::Op op, int64_t dst, const std::vector<sim::Operand>& src,
                    int64_t n);
// Reduces each of `rows` rows of `cols` f32 values (row stride `ld` floats, at VMEM byte address
// src) with the cross-lane op `xop` into one f32 per row at dst. Rows wider than a vreg are
// first folded lane-wise with the vector op `vop` into the scratch at `fold` (rows x lanes f32).
void emit_row_reduce(sim::ProgramBuilder& b, int64_t lanes, sim::Op xop, sim::Op vop, int64_t dst, int64_t src,
                     int64_t ld, int64_t fold, int64_t rows, int64_t cols);
// Fills n contiguous f32 values at VMEM byte address dst with `value`, shaped the same way.
void emit_dense_fill(sim::ProgramBuilder& b, int64_t lanes, int64_t dst, float value, int64_t n);

}  // namespace tpu::codegen
