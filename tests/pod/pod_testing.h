// Shared by the pod tests: the 2x2 pod of tiny chips they run on (unless the environment names
// another), the chips as devices, and running one thread per rank.
#pragma once

#include <cstdlib>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tpucore/core/device.h"
#include "tpucore/devices.h"

namespace pod_testing {

// Set before any test touches a sim device (static initialization of each test file).
inline const bool g_env = [] {
  setenv("TPU_SIM_CHIP", "tiny", 0);
  setenv("TPU_SIM_POD", "2x2", 0);
  return true;
}();

inline tpu::Device chip(int r) { return tpu::Device(tpu::DeviceType::sim, r); }

// Catch2's assertions are not thread-safe: inside on_ranks, failed expectations throw instead
// (on_ranks rethrows them on the test's thread).
inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("expectation failed: " + what);
}

// Runs fn(rank) on one thread per rank; rethrows the first rank's error (by rank order).
inline void on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> err(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        err[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

// Sets f32 matmul precision to "highest" (f32-accurate products on the chips, to match host f32
// references) for a scope, and restores the previous setting at its end.
struct HighestF32Precision {
  std::string prev = tpu::float32_matmul_precision();
  HighestF32Precision() { tpu::set_float32_matmul_precision("highest"); }
  ~HighestF32Precision() { tpu::set_float32_matmul_precision(prev); }
  HighestF32Precision(const HighestF32Precision&) = delete;
  HighestF32Precision& operator=(const HighestF32Precision&) = delete;
};

}  // namespace pod_testing
