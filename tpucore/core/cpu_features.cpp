#include "tpucore/core/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace tpu {

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures r;
    const char* force = std::getenv("TPU_CPU_FEATURES");
    if (force && std::strcmp(force, "generic") == 0) return r;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    r.avx2 = __builtin_cpu_supports("avx2");
    r.fma = __builtin_cpu_supports("fma");
    r.avx512f = __builtin_cpu_supports("avx512f");
    r.avx512bw = __builtin_cpu_supports("avx512bw");
    r.avx512vl = __builtin_cpu_supports("avx512vl");
    // GCC 12 knows "avx512bf16" for __builtin_cpu_supports.
    r.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
#endif
    return r;
  }();
  return f;
}

}  // namespace tpu
