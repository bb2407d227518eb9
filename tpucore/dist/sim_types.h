// What the simulated pod's ICI carries: a tensor dtype mapped onto the pod's element types,
// shared by the sim backend and the symmetric (large-slice) groups.
#pragma once

#include <string>

#include "sim/pod.h"
#include "sim/types.h"
#include "tpucore/core/dtype.h"

namespace tpu::dist {

// Maps `t` onto the pod's (dtype, element type); a tpu::Error starting with `what` for a dtype
// the pod does not carry (i64).
void pod_type(DType t, sim::DType& d, sim::ElemType& e, const std::string& what);

}  // namespace tpu::dist
