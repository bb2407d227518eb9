// Tile configuration of Intel AMX shared by the bf16 and int8 AMX kernels (gemm_amx.cpp,
// gemm_amx_int8.cpp): the 64-byte LDTILECFG block, and a scope that keeps the thread's previous
// configuration. Other code on the same thread (llama.cpp's AMX kernels, in the benchmark that runs
// both engines) may configure the tiles once per thread and expect them to stay so; releasing the
// tiles at the end of a kernel would make its next tile instruction fault. Restoring a
// configuration zeroes the tile data, which such code does not keep across calls.
#pragma once

#include <immintrin.h>

#include <cstdint>

#define TPU_AMX_TILE __attribute__((target("amx-tile")))

namespace tpu::kernels::amx {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads `c` (GCC 12 does not treat ldtilecfg as reading its operand and drops the stores that
// filled it without the barrier; the tiles then stay unconfigured and the first tile load faults).
TPU_AMX_TILE inline void load_config(const TileConfig& c) {
  asm volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

// The thread's configuration on entry, put back on exit (released when there was none).
struct SavedTiles {
  TileConfig config;
  TPU_AMX_TILE SavedTiles() {
    _tile_storeconfig(&config);  // all zero when the tiles are not configured
    asm volatile("" : : "r"(&config) : "memory");
  }
  TPU_AMX_TILE ~SavedTiles() {
    asm volatile("" : : "r"(&config) : "memory");
    if (config.palette != 0) _tile_loadconfig(&config);
    else _tile_release();
  }
  SavedTiles(const SavedTiles&) = delete;
  SavedTiles& operator=(const SavedTiles&) = delete;
};

}  // namespace tpu::kernels::amx
