// Batch-invariant numerics: while enabled, every row of a host matrix product (matmul, linear)
// is computed with the same reduction order whatever the number of rows in the product, so a
// row's result does not depend on the other rows computed with it (the serving engine's
// requests in one step). The host GEMM then always takes its packed path with a fixed K
// blocking and a fixed per-element accumulation order (no few-row GEMV kernels, no AMX tiles
// from 16 rows, no direct loops for tiny products); threads split rows and columns, never K.
//
// The setting is process-wide (a count of live scopes): kernels run on pool threads, which a
// thread-local setting would not reach. Enabling it changes no result that is already
// invariant; it only costs the speed of the few-row kernels.
#pragma once

#include <atomic>

namespace tpu {

// True while at least one BatchInvariantScope is alive.
bool batch_invariant();

// Holds the mode on for its lifetime (nestable; scopes on several threads count up).
class BatchInvariantScope {
 public:
  explicit BatchInvariantScope(bool enable = true);
  ~BatchInvariantScope();
  BatchInvariantScope(const BatchInvariantScope&) = delete;
  BatchInvariantScope& operator=(const BatchInvariantScope&) = delete;

 private:
  bool enabled_;
};

}  // namespace tpu
