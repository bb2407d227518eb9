#include "sim/timing_model.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include <fmt/format.h>

#include "sim/error.h"

namespace tpu::sim::detail {

void IntervalUnion::add(uint64_t lo, uint64_t len) {
  uint64_t hi = lo + len;
  auto it = iv_.upper_bound(lo);
  if (it != iv_.begin() && std::prev(it)->second >= lo) --it;
  while (it != iv_.end() && it->first <= hi) {  // merge every interval overlapping or adjacent
    lo = std::min(lo, it->first), hi = std::max(hi, it->second);
    bytes_ -= it->second - it->first;
    it = iv_.erase(it);
  }
  iv_.emplace(lo, hi);
  bytes_ += hi - lo;
}

}  // namespace tpu::sim::detail

namespace tpu::sim {

double calibrated_cycles(const ChipConfig& cfg, const CountedWork& w) {
  const TimingConfig& t = cfg.timing;
  // Compute: each core's MXU work spread over its MXUs (narrow N included) at the sustained
  // fraction of the peak (plus the weight loads streaming does not hide), or its vector-unit
  // work; the busiest core sets the time. A program that codegen did not split over the cores
  // runs on core 0 alone.
  double c = 0, mxu = 0, narrow = 0, dmas = 0;
  bool reduces = false;
  for (const CoreWork& k : w.cores) {
    const double mxu_c = (k.mxu_stream_cycles + t.weight_load_exposed * k.mxu_weight_cycles) / (cfg.mxu.count * t.mxu_efficiency);
    c = std::max({c, mxu_c, k.vector_cycles});
    mxu += k.mxu_stream_cycles;
    narrow += k.narrow_store_bytes;
    dmas = std::max(dmas, k.dmas);
    reduces = reduces || k.xlu_cycles > 0;
  }
  // Memory: the device's HBM (all its cores' bandwidth) is shared by the cores. Kernels that
  // store 16-bit vector results sustain hbm_efficiency, the others wide_hbm_efficiency; a kernel
  // doing both weighs them by the share of its written bytes stored as 16-bit results.
  const double bw = cfg.hbm_bytes_per_cycle() * t.megacore;
  const double wide = t.wide_hbm_efficiency > 0 ? t.wide_hbm_efficiency : t.hbm_efficiency;
  const double share = w.compulsory_written_bytes > 0 ? std::min(1.0, narrow / double(w.compulsory_written_bytes)) : 0.0;
  const double m = double(w.compulsory_bytes()) / bw * (share / t.hbm_efficiency + (1 - share) / wide);
  const double fill = mxu > 0 ? cfg.mxu.fill_cycles : 0;
  const double priced = fill + std::max(c, m) + (1 - t.memory_overlap) * std::min(c, m);
  const double fixed = t.launch_cycles + (reduces ? t.reduce_cycles : 0) + t.dma_cycles * dmas;
  // Re-reads of a tiled kernel hide under compute, but never beyond the peak bandwidth.
  return fixed + std::max(priced, double(w.traffic_bytes) / bw);
}

}  // namespace tpu::sim

namespace tpu::sim {

double xla_matmul_cycles(const ChipConfig& cfg, const XlaMatmulFeed& f, double kernel_cycles) {
  if (f.m <= 0 || f.n <= 0 || f.k <= 0)
    throw SimError(fmt::format("xla_matmul_cycles: dimensions must be positive (m {}, n {}, k {})", f.m, f.n, f.k));
  if (f.prefetched != 'A' && f.prefetched != 'B')
    throw SimError(fmt::format("xla_matmul_cycles: prefetched operand must be 'A' or 'B', not '{}'", f.prefetched));
  const TimingConfig& t = cfg.timing;
  double cycles = kernel_cycles;
  if (!t.calibrated()) return cycles;
  const double m = double(f.m), n = double(f.n), k = double(f.k);
  const double panel = double(cfg.mxu.cols);
  // The prefetched operand sits in on-chip memory and is converted to the MXU's type once. A
  // streamed A (B prefetched) passes the MXUs once per 128-column panel of N and is converted
  // again on every pass, at the same rate; that sets the pace when it outweighs the kernel.
  if (t.convert_elems_per_cycle > 0) {
    cycles += (f.prefetched == 'A' ? m * k : k * n) / t.convert_elems_per_cycle;
    if (f.prefetched == 'B') cycles = std::max(cycles, m * k * std::ceil(n / panel) / t.convert_elems_per_cycle);
    // With A prefetched the MXUs produce C row by row (N in the lanes); a C stored {0,1} is written
    // transposed, every element through the cross-lane unit and the 16-bit conversion, at the same
    // per-element rate (not when A, B and C are all {0,1}: that is C^T = B^T A^T on the stored bytes).
    if (xla_matmul_transposes_out(f)) cycles += m * n / t.convert_elems_per_cycle;
  }
  // The other operand streams through the MXUs once per panel of the prefetched side's free
  // dimension (N for a streamed A, M for a streamed B). When XLA re-feeds it per panel (transposed
  // on the cross-lane unit and converted on the vector unit on every pass), that sets the pace.
  if (t.restream_elems_per_cycle > 0 && xla_matmul_refeeds(f)) {
    const double fed = f.prefetched == 'A' ? k * n * std::ceil(m / panel) : m * k * std::ceil(n / panel);
    cycles = std::max(cycles, fed / t.restream_elems_per_cycle);
  }
  return cycles;
}

bool xla_matmul_refeeds(const XlaMatmulFeed& f) {
  if (f.m <= 0 || f.n <= 0 || f.k <= 0)
    throw SimError(fmt::format("xla_matmul_refeeds: dimensions must be positive (m {}, n {}, k {})", f.m, f.n, f.k));
  if (f.prefetched != 'A' && f.prefetched != 'B')
    throw SimError(fmt::format("xla_matmul_refeeds: prefetched operand must be 'A' or 'B', not '{}'", f.prefetched));
  const bool a_streams = f.prefetched == 'B';
  // With A prefetched, A, B and C all {0,1} is C^T = B^T A^T on the stored bytes: B^T streams in
  // its own orientation. (With B prefetched the measured kernels follow the rule below instead.)
  if (!a_streams && f.a_transposed && f.b_transposed && f.out_transposed) return false;
  if (!(a_streams ? f.a_transposed : f.b_transposed)) return false;
  // Stored {0,1}, A is [K][M] and B is [N][K]: the second-minor dimension and the free one.
  const int64_t second_minor = a_streams ? f.k : f.n;
  const int64_t free_dim = a_streams ? f.m : f.n;
  const bool odd_row_tiles = (second_minor + 7) / 8 % 2 == 1;
  return odd_row_tiles || free_dim < kXlaRefeedWideCols;
}

bool xla_matmul_transposes_out(const XlaMatmulFeed& f) {
  return f.prefetched == 'A' && f.out_transposed && !(f.a_transposed && f.b_transposed);
}

namespace {
// Elements a [rows, cols] array occupies stored {1,0} (cols minor) in v4's (8, 128) tiles.
double tiled_elems(int64_t rows, int64_t cols) { return double((rows + 7) / 8 * 8) * double((cols + 127) / 128 * 128); }
// XLA's layout assignment between {1,0} and {0,1}: the smaller tiled footprint, {1,0} on a tie.
bool stored_transposed(int64_t rows, int64_t cols) { return tiled_elems(cols, rows) < tiled_elems(rows, cols); }
}  // namespace

XlaMatmulFeed xla_matmul_feed(int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0)
    throw SimError(fmt::format("xla_matmul_feed: dimensions must be positive (m {}, n {}, k {})", m, n, k));
  XlaMatmulFeed f;
  f.m = m, f.n = n, f.k = k;
  f.a_transposed = stored_transposed(m, k);
  f.b_transposed = stored_transposed(k, n);
  f.out_transposed = stored_transposed(m, n);
  f.prefetched = m >= n ? 'A' : 'B';
  return f;
}

}  // namespace tpu::sim
