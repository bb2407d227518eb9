// f32 matmul precision on sim devices, like torch.set_float32_matmul_precision and XLA's
// precision config on TPU: the MXUs multiply bf16, so an f32 matmul is one bf16 pass
// ("default", also accepted as "medium": inputs rounded to bf16, f32 accumulation; the default of
// JAX and PyTorch/XLA on TPU), three passes ("high": bf16_3x, inputs split into bf16 hi + lo) or
// six ("highest": f32-accurate products). Each pass costs the MXU a bf16 pass in cycles
// (sim MXU modes bf16, bf16x3, f32 with f32_cycles_per_row = 6 on the TPU presets). bf16 inputs
// always take one pass; host (CPU) matmuls are unaffected. Process-wide; read when a matmul or
// attention program is built (the mode is part of the program's cache key). The environment
// variable TPU_F32_MATMUL_PRECISION sets the value a process starts with.
#pragma once

#include <string>

#include "sim/isa.h"

namespace tpu {

// "default" (or "medium"), "high" or "highest"; anything else is a tpu::Error naming the choices.
void set_float32_matmul_precision(const std::string& precision);
// "default", "high" or "highest".
std::string float32_matmul_precision();
// bf16 passes per f32 matmul at the current setting (1, 3 or 6).
int float32_matmul_passes();

namespace codegen {
// The MXU mode of an f32 matmul at the current setting.
sim::MxuMode f32_matmul_mode();
}  // namespace codegen

}  // namespace tpu
