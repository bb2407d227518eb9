// Tensor-parallel scenarios of the sharded-training worker (placeholder until the TP layers land).
#include "model.h"

namespace sharded_test {
int scenario_tp_train(int) { return 64; }
int scenario_tp_bad() { return 64; }
}  // namespace sharded_test
