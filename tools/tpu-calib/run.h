// Simulating one measured row through the library on sim:0 (timing only): the kernels XLA ran
// for it, as eager calls or through tpu::compile.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "sim/stats.h"
#include "sim/timing_model.h"
#include "tools/tpu-calib/data.h"

namespace tpu::calib {

struct Simulated {
  bool ok = false;           // false: a part ran on the host, or the path does not apply
  std::string why;           // when not ok
  double us = 0;             // simulated microseconds of the call (all its kernels)
  int kernels = 0;           // programs the call ran
  std::vector<sim::CountedWork> works;  // their counted work, to re-price under other constants
  std::optional<sim::XlaMatmulFeed> feed;  // matmul_large: how XLA fed the kernel (applied to `us`)
  double kernel_us = 0;      // with a feed: the library kernel's own price, before the feed
};

// The feed of a matmul row that names its layouts and prefetched operand (matmul_large).
std::optional<sim::XlaMatmulFeed> xla_feed(const Row& r);

// compiled: through tpu::compile (one traced function per XLA fusion); else eager op calls.
// Activations that are compositions of library ops (leaky_relu, elu, ...) run compiled only:
// eagerly they would be several kernels where XLA runs one fusion.
Simulated simulate(const Row& r, bool compiled);

}  // namespace tpu::calib
