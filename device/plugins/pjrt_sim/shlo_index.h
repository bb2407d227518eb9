// The gather and scatter forms of the StableHLO subset (see shlo_index.cpp).
#pragma once

#include "device/plugins/pjrt_sim/shlo_program.h"

namespace tpu::pjrt_sim {

Tensor run_gather(const Op& op, const Tensor& x, const Tensor& idx);
Tensor run_scatter(const Op& op, const Tensor& x, const Tensor& idx, const Tensor& upd);

}  // namespace tpu::pjrt_sim
