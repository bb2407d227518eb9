// Helpers shared by the simulator tests.
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "sim/chip.h"
#include "sim/presets.h"
#include "sim/types.h"

namespace simtest {

inline tpu::sim::Chip tiny() { return tpu::sim::Chip(tpu::sim::preset_config("tiny")); }

inline std::vector<float> random_floats(size_t n, unsigned seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = tpu::sim::f32_to_bf16_bits(v[i]);
  return o;
}

template <class T>
void put(tpu::sim::Chip& c, tpu::sim::Space s, uint64_t addr, const std::vector<T>& v) {
  if (s == tpu::sim::Space::hbm) c.write_hbm(addr, v.data(), v.size() * sizeof(T));
  else c.write_vmem(addr, v.data(), v.size() * sizeof(T));
}

template <class T>
std::vector<T> get(tpu::sim::Chip& c, tpu::sim::Space s, uint64_t addr, size_t n) {
  std::vector<T> v(n);
  if (s == tpu::sim::Space::hbm) c.read_hbm(addr, v.data(), n * sizeof(T));
  else c.read_vmem(addr, v.data(), n * sizeof(T));
  return v;
}

}  // namespace simtest
