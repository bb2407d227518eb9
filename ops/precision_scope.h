// Eager-equal numerics inside compiled graphs: set on a thread while a graph compiled with
// emulate_precision_casts runs (tpucore/compile.h). An op kernel that has a faster form with
// other numerics than its eager one (e.g. a chip kernel reading the whole KV cache under a mask)
// takes the eager one while it is set.
#pragma once

namespace tpu::ops {

class EmulatePrecisionScope {
 public:
  explicit EmulatePrecisionScope(bool on);
  ~EmulatePrecisionScope();
  EmulatePrecisionScope(const EmulatePrecisionScope&) = delete;
  EmulatePrecisionScope& operator=(const EmulatePrecisionScope&) = delete;

 private:
  bool prev_;
};
bool emulating_precision_casts();

}  // namespace tpu::ops
