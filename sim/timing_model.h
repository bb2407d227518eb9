// The calibrated timing model (config.h, TimingConfig; sim/README.md "Timing models"): prices a
// program by the work the event timeline counted (Stats::work). The executor applies it to every
// run on a calibrated chip; tools may re-price a run's counted work under other constants (the
// cross-validation of tpu-calib).
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "sim/config.h"
#include "sim/stats.h"

namespace tpu::sim::detail {

// Union of byte intervals [lo, hi): the bytes of HBM a program touched at least once.
class IntervalUnion {
 public:
  void add(uint64_t lo, uint64_t len);
  uint64_t bytes() const { return bytes_; }

 private:
  std::map<uint64_t, uint64_t> iv_;  // lo -> hi, disjoint and not adjacent
  uint64_t bytes_ = 0;
};

}  // namespace tpu::sim::detail

namespace tpu::sim {

// launch + fill + max(C, M) + (1 - overlap) min(C, M), at least launch + traffic at peak bandwidth;
// C is the busiest core's compute, M the device's (shared) HBM time.
double calibrated_cycles(const ChipConfig& cfg, const CountedWork& w);

}  // namespace tpu::sim

namespace tpu::sim {

// One XLA matmul kernel C[M,N] = A[M,K] @ B[K,N] on 16-bit inputs as XLA's HLO describes it: the
// operands' and the result's layouts and the operand its fusion prefetched into on-chip memory.
struct XlaMatmulFeed {
  int64_t m = 0, n = 0, k = 0;
  bool a_transposed = false;    // A stored {0,1}: M minor (the MXU streams rows with K minor)
  bool b_transposed = false;    // B stored {0,1}: K minor (the MXU's weight panels hold N minor)
  bool out_transposed = false;  // C stored {0,1}
  char prefetched = 'A';        // 'A' or 'B'
};

// Cycles of that kernel on `cfg`'s calibrated model, from `kernel_cycles` (the calibrated price of
// the library's matmul kernel of the same shape): the prefetched operand's one-time conversion is
// added; when the streamed operand needs an in-kernel transpose (and the whole product is not
// the canonical one transposed: A, B and C all {0,1}), it is transposed and converted once per
// 128-column panel of the other side, and the kernel takes at least that long; an A-prefetched
// kernel whose C is stored {0,1} (xla_matmul_transposes_out) converts and transposes each element
// of C at the conversion rate (sim/README.md,
// "XLA's float16 matmul kernels"). Unchanged on the ideal model and where the feed constants are 0. Throws
// SimError on a non-positive dimension or a prefetched operand other than 'A' or 'B'.
double xla_matmul_cycles(const ChipConfig& cfg, const XlaMatmulFeed& f, double kernel_cycles);

// Whether that kernel re-feeds its streamed operand once per 128-column MXU panel of the other side
// (the slow mode, sim/README.md "XLA's float16 matmul kernels"): the streamed operand (A when B is
// prefetched, else B) is stored against the MXU's orientation (A {0,1}, B {0,1}), the product is
// not the canonical C^T = B^T A^T (A, B and C all {0,1} with A prefetched), and either its stored
// second-minor dimension (K for A {0,1}, N for B {0,1}) spans an odd number of 8-row tiles or its
// free dimension (M for A, N for B) is under kXlaRefeedWideCols. Throws SimError like xla_matmul_cycles.
inline constexpr int64_t kXlaRefeedWideCols = 2048;
bool xla_matmul_refeeds(const XlaMatmulFeed& f);

// Whether that kernel writes C against the MXU's row order: A prefetched, C stored {0,1}, and not
// A, B and C all {0,1} (the canonical C^T = B^T A^T). Checks nothing; xla_matmul_cycles validates.
bool xla_matmul_transposes_out(const XlaMatmulFeed& f);

// The feed XLA gives C[M,N] = A[M,K] @ B[K,N] on 16-bit arrays on v4, from the shapes alone (sim/README.md,
// "XLA's float16 matmul kernels"): each array takes the layout whose (8, 128)-tiled footprint is
// smaller ({0,1} only when strictly smaller than {1,0}: rows rounded up to 8, the minor dimension to
// 128), and the fusion prefetches the larger operand (A when M >= N). Throws SimError on a
// non-positive dimension.
XlaMatmulFeed xla_matmul_feed(int64_t m, int64_t n, int64_t k);

}  // namespace tpu::sim
