// Batch-invariant numerics: while enabled, every row of a host matrix product (matmul, linear)
// is computed with the same reduction order whatever the number of rows in the product, so a
// row's result does not depend on the other rows computed with it (the serving engine's
// requests in one step). Every output of the host GEMM is then summed in the packed GEMM
// micro-kernel's order: one chain of multiply-adds along K per element, restarted at the GEMM's
// fixed K blocks whose sums are added to C in turn. Few rows of x W^T take a broadcast kernel
// that reads the weight in place and keeps each row in its own vector lane with exactly that
// order (as fast as the few-row GEMV kernels from five rows on); other products the packed path.
// Never the dot-product GEMV kernels, AMX tiles or direct loops of tiny products, which sum in
// other orders; threads split rows and columns, never K.
//
// The setting is process-wide (a count of live scopes): kernels run on pool threads, which a
// thread-local setting would not reach. Enabling it changes no result that is already
// invariant; its cost is the speed of the one- to four-row products (the broadcast kernel
// instead of dot products along K).
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
