#include "ops/precision_scope.h"

namespace tpu::ops {
namespace {
thread_local bool t_emulate = false;
}  // namespace

EmulatePrecisionScope::EmulatePrecisionScope(bool on) : prev_(t_emulate) { t_emulate = on; }
EmulatePrecisionScope::~EmulatePrecisionScope() { t_emulate = prev_; }
bool emulating_precision_casts() { return t_emulate; }

}  // namespace tpu::ops
