// Host CPU features, detected once at run time (the library is not compiled for one CPU).
#pragma once

namespace tpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_bf16 = false;
  bool amx_bf16 = false;
};

// Detected features; TPU_CPU_FEATURES=generic forces the portable paths (for testing them).
const CpuFeatures& cpu_features();

}  // namespace tpu
