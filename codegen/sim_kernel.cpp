#include <spdlog/spdlog.h>

#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "ops/fallback.h"
#include "tpucore/core/log.h"

namespace tpu::codegen {

void install_lowering(const char* op, const Lowering* rule) {
  // The op may be defined after this runs (static initialization order); the registry keeps the
  // rule until then (ops::undefined_registrations() lists any never matched).
  ops::set_lowering(op, const_cast<Lowering*>(rule));
  ops::register_kernel(op, DeviceType::sim, &sim_kernel);
  // tpu:N runs the same programs when its driver plugin describes its chip (ABI version 2).
  ops::register_kernel(op, DeviceType::tpu, &sim_kernel);
}

void sim_kernel(const ops::KernelArgs& k) {
  if (!k.outputs.empty() && !runs_generated_programs(k.outputs[0].device())) {
    ops::run_on_host(k.op, k.inputs, k.attrs, k.outputs);  // a plugin without a chip description
    return;
  }
  const Lowering* rule = lowering_of(k.op);
  bool done = false;
  if (rule) done = rule->eager ? rule->eager(k) : rule->elementwise ? eager_elementwise(k, *rule) : false;
  if (done) return;
  count_host_fallback();
  ops::run_on_host(k.op, k.inputs, k.attrs, k.outputs);
}

}  // namespace tpu::codegen
