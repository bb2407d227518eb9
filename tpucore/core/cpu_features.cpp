#include "tpucore/core/cpu_features.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

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
    {  // AMX: cpuid leaf 7 EDX bits 22 (AMX-BF16) and 24 (AMX-TILE); the OS grant is asked for by its user
      unsigned a = 0, b = 0, c = 0, d = 0;
      if (__get_cpuid_max(0, nullptr) >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d))
        r.amx_bf16 = ((d >> 22) & 1u) && ((d >> 24) & 1u);
    }
#endif
    if (force && std::strcmp(force, "avx2") == 0) {  // an AVX2-only CPU, to run its kernels here
      const CpuFeatures all = r;
      r = CpuFeatures{};
      r.avx2 = all.avx2;
      r.fma = all.fma;
    }
    return r;
  }();
  return f;
}

bool add_cache_level(CpuCaches& c, int level, const char* type, const char* size, int sharing) {
  if (!type || !size || std::strcmp(type, "Instruction") == 0) return false;
  char* end = nullptr;
  const long long v = std::strtoll(size, &end, 10);
  if (end == size || v <= 0) return false;
  long long bytes = v;
  if (*end == 'K' || *end == 'k') bytes = v << 10;
  else if (*end == 'M' || *end == 'm') bytes = v << 20;
  else if (*end == 'G' || *end == 'g') bytes = v << 30;
  else if (*end != '\0' && *end != '\n') return false;
  if (sharing < 1) sharing = 1;
  if (level == 1) c.l1d = bytes;
  else if (level == 2) c.l2 = bytes / sharing;
  else if (level == 3) c.l3 = bytes / sharing;
  else return false;
  return true;
}

namespace {

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// Logical CPUs in a list such as "0-1,4,6-7".
int count_cpus(const std::string& list) {
  int n = 0;
  std::stringstream ss(list);
  std::string part;
  while (std::getline(ss, part, ',')) {
    int a = 0, b = 0;
    if (std::sscanf(part.c_str(), "%d-%d", &a, &b) == 2) n += b >= a ? b - a + 1 : 1;
    else if (!part.empty()) ++n;
  }
  return n > 0 ? n : 1;
}

bool caches_from_sysfs(CpuCaches& c) {
  bool any = false;
  for (int i = 0; i < 16; ++i) {
    const std::string d = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const std::string level = read_line(d + "level");
    if (level.empty()) break;
    any |= add_cache_level(c, std::atoi(level.c_str()), read_line(d + "type").c_str(), read_line(d + "size").c_str(),
                           count_cpus(read_line(d + "shared_cpu_list")));
  }
  return any;
}

#if defined(__x86_64__) && defined(__GNUC__)
// Deterministic cache parameters: cpuid leaf 4 (Intel) or 0x8000001D (AMD), one subleaf per cache.
void caches_from_cpuid(CpuCaches& c) {
  unsigned a, b, cc, d;
  __cpuid(0, a, b, cc, d);
  const bool amd = b == 0x68747541;  // "Auth"enticAMD
  const unsigned leaf = amd ? 0x8000001Du : 4u;
  if (amd) {
    __cpuid(0x80000000u, a, b, cc, d);
    if (a < leaf) return;
  } else if (a < leaf) {
    return;
  }
  for (unsigned sub = 0; sub < 16; ++sub) {
    __cpuid_count(leaf, sub, a, b, cc, d);
    const unsigned type = a & 0x1f;
    if (type == 0) break;
    const int level = static_cast<int>((a >> 5) & 0x7);
    const long long ways = ((b >> 22) & 0x3ff) + 1, parts = ((b >> 12) & 0x3ff) + 1, line = (b & 0xfff) + 1;
    const long long sets = static_cast<long long>(cc) + 1;
    const int sharing = static_cast<int>(((a >> 14) & 0xfff) + 1);
    const std::string size = std::to_string(ways * parts * line * sets);
    add_cache_level(c, level, type == 2 ? "Instruction" : (type == 1 ? "Data" : "Unified"), size.c_str(), sharing);
  }
}
#endif

}  // namespace

const CpuCaches& cpu_caches() {
  static const CpuCaches c = [] {
    CpuCaches r;
    if (!caches_from_sysfs(r)) {
#if defined(__x86_64__) && defined(__GNUC__)
      caches_from_cpuid(r);
#endif
    }
    return r;
  }();
  return c;
}

}  // namespace tpu
