// Host fallback: runs an op's cpu kernel for a device that has no kernel of its own, by
// copying inputs to the host and the outputs back. Logged once per op and counted.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ops/registry.h"

namespace tpu::ops {

void run_on_host(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs, std::span<Tensor> outputs);

struct FallbackCount {
  std::string op;
  Device device;
  uint64_t calls = 0;
};
std::vector<FallbackCount> fallback_counts();
uint64_t total_fallbacks();

// Copies a tensor's elements between devices (contiguous result on `to`).
Tensor copy_to_device(const Tensor& t, Device to);

}  // namespace tpu::ops
