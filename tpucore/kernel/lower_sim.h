// The chip lowering of kernels (lower_sim.cpp): programs of the simulated chip's ISA.
#pragma once

#include <span>
#include <string>

#include "sim/config.h"
#include "sim/program.h"
#include "tpucore/kernel/internal.h"

namespace tpu::kernel::detail {

// The program of a kernel for these operand types on a chip (a tpu::Error naming what is not
// lowered). `scalars`: the values of the scalar-prefetch inputs (the first inputs), read at build
// time. check_copies false leaves a scratch buffer touched during its async copy to the chip's
// race checker (tests of that checker) instead of failing the build.
sim::Program lower_to_chip(const KernelDef& k, std::span<const TensorType> inputs, std::span<const TensorType> outputs,
                           const sim::ChipConfig& cfg, std::span<const Tensor> scalars = {}, bool check_copies = true);
// Runs the kernel on the chip device of `outputs` (allocated there), the program cached under
// `cache_key` per device.
void run_on_chip(const KernelDef& k, const std::string& cache_key, std::span<const Tensor> inputs,
                 std::span<Tensor> outputs);

}  // namespace tpu::kernel::detail
