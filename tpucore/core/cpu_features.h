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

// Detected features; TPU_CPU_FEATURES=generic forces the portable paths, TPU_CPU_FEATURES=avx2
// keeps only AVX2 and FMA (for testing and measuring those paths on a wider CPU).
const CpuFeatures& cpu_features();

// Data cache sizes in bytes available to one thread: the L1 data cache, and the shares of the
// L2 and L3 of one logical CPU (each size divided by the number of logical CPUs sharing that
// cache). 0 = not found.
struct CpuCaches {
  long long l1d = 0;
  long long l2 = 0;
  long long l3 = 0;
};

// Detected once: from /sys/devices/system/cpu/cpu0/cache (Linux), else from cpuid (leaf 4 on
// Intel, 0x8000001D on AMD); levels that neither reports stay 0.
const CpuCaches& cpu_caches();

// One cache as the kernel describes it (level, "Data"/"Unified"/"Instruction", size text such
// as "32K" or "1024K" or "32M", and the count of logical CPUs sharing it): parsed into `c`.
// Returns false, leaving `c` unchanged, for an instruction cache or an unreadable size.
bool add_cache_level(CpuCaches& c, int level, const char* type, const char* size, int sharing);

}  // namespace tpu
