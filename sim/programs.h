// Program generators for tests, benchmarks and the CLI (codegen will produce its own):
// a double-buffered tiled GEMM and an HBM-bound streaming copy.
#pragma once
#include <cstdint>
#include <string>

#include "sim/config.h"
#include "sim/program.h"

namespace tpu::sim {

struct GemmSpec {
  int64_t m = 0, n = 0, k = 0;
  MxuMode mode = MxuMode::bf16;  // A, B stored as bf16 (f32 for f32 mode, i8 for i8 mode)
  int64_t block_m = 0;           // rows of A per VMEM block; 0 = choose
};

// C[m x n] (f32; i32 in i8 mode) = A[m x k] * B[k x n], all row-major in HBM at the given
// addresses. Needs k % mxu.rows == 0 and n % mxu.cols == 0.
//
// Schedule: N is cut into panels of (MXUs x mxu.cols) columns, one column tile per MXU; M into
// blocks of block_m rows. A blocks and B panels are double-buffered in VMEM and prefetched one
// step ahead on their own DMA queues; each MXU loops over the K tiles (weight load of the next
// tile overlaps the current tile's LHS stream) accumulating into a double-buffered C tile,
// which a third DMA queue stores while the next panel computes.
struct GemmProgram {
  Program program;
  uint64_t a_addr = 0, b_addr = 0, c_addr = 0;  // HBM
  uint64_t hbm_bytes = 0;                       // end of C
  int64_t block_m = 0, panel_n = 0;
  uint64_t vmem_bytes = 0;                      // VMEM used by the buffers
};
GemmProgram make_gemm(const ChipConfig& cfg, const GemmSpec& spec, uint64_t a_addr = 0);

// Copies `bytes` from HBM src to HBM dst through VMEM in `chunk`-byte pieces with `buffers`
// VMEM buffers (loads run buffers-1 chunks ahead of stores). bytes % chunk == 0.
struct CopyProgram {
  Program program;
  uint64_t src = 0, dst = 0;
};
CopyProgram make_stream_copy(const ChipConfig& cfg, uint64_t bytes, uint64_t chunk = uint64_t(1) << 20,
                             int buffers = 4, uint64_t src = 0, uint64_t dst = 0);

}  // namespace tpu::sim
