// The main example: a bf16 GEMM program runs on the simulated TPU chip (v5e-like preset by
// default), its result is checked against tpucore's host matmul of the same bf16 values, and
// the simulator's stats report and a Chrome/Perfetto trace are written. Then the same chip
// costs a 4096^3 GEMM in timing-only mode.
//
//   main_example [--chip v5e] [--size 512] [--trace gemm_trace.json]
#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "sim/chip.h"
#include "sim/presets.h"
#include "sim/programs.h"
#include "sim/stats.h"
#include "sim/trace.h"
#include "tools/cli_args.h"
#include "tpucore/ops.h"

int main(int argc, char** argv) {
  std::string chip_name = "v5e", trace_path = "gemm_trace.json";
  int64_t n = 512;
  tpu::cli::Parser args("main_example",
                        "A bf16 GEMM program on the simulated chip, checked against the host matmul, with its stats\n"
                        "report and a Chrome/Perfetto trace; then a 4096^3 GEMM costed in timing-only mode.");
  args.value("--chip", "NAME", "chip preset or config JSON (default v5e)", [&](const std::string& v) { chip_name = v; });
  args.value("--size", "N", "the GEMM is N x N x N (default 512)", [&](const std::string& v) { n = args.to_int(v); });
  args.value("--trace", "FILE", "trace output (default gemm_trace.json)", [&](const std::string& v) { trace_path = v; });
  if (auto rc = args.parse(argc, argv)) return *rc;
  try {
    tpu::sim::Chip chip = tpu::sim::Chip::create(chip_name);
    const auto& cfg = chip.config();
    fmt::print("chip: {} ({} MXU(s) of {}x{}, {:.0f} MHz)\n", cfg.name, cfg.mxu.count, cfg.mxu.rows, cfg.mxu.cols,
               cfg.clock_ghz * 1e3);

    // Inputs: random values, rounded to bf16 by tpucore (round to nearest even).
    tpu::manual_seed(42);
    tpu::Tensor a = tpu::randn({n, n}).to(tpu::DType::bf16);
    tpu::Tensor b = tpu::randn({n, n}).to(tpu::DType::bf16);

    tpu::sim::GemmProgram g = tpu::sim::make_gemm(cfg, {.m = n, .n = n, .k = n});
    chip.write_hbm(g.a_addr, a.raw_data(), a.nbytes());
    chip.write_hbm(g.b_addr, b.raw_data(), b.nbytes());
    auto t0 = std::chrono::steady_clock::now();
    auto res = chip.run(g.program, {.trace = true});
    double host_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    std::vector<float> c(static_cast<size_t>(n * n));
    chip.read_hbm(g.c_addr, c.data(), c.size() * sizeof(float));
    tpu::Tensor ref = tpu::matmul(a.to(tpu::DType::f32), b.to(tpu::DType::f32));
    const float* r = ref.data<float>();
    double max_err = 0;
    for (size_t i = 0; i < c.size(); ++i) max_err = std::max(max_err, static_cast<double>(std::fabs(c[i] - r[i])));

    fmt::print("\n{}x{}x{} bf16 GEMM on the simulator (functional, {:.2f} s of host time)\n", n, n, n, host_s);
    fmt::print("{}", tpu::sim::format_report(res.stats));
    fmt::print("max |sim - host matmul| = {:.3g}  ({})\n", max_err, max_err < 1e-2 ? "OK" : "MISMATCH");
    tpu::sim::write_chrome_trace(trace_path, res.trace, &g.program);
    fmt::print("trace written to {} (open it in https://ui.perfetto.dev)\n", trace_path);

    // Timing-only: cost a model-sized GEMM in a fraction of a second.
    tpu::sim::GemmProgram big = tpu::sim::make_gemm(cfg, {.m = 4096, .n = 4096, .k = 4096});
    tpu::sim::Chip big_chip = tpu::sim::Chip::create(chip_name);
    t0 = std::chrono::steady_clock::now();
    auto big_res = big_chip.run(big.program, {.timing_only = true});
    host_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("\n4096^3 bf16 GEMM, timing-only ({:.3f} s of host time)\n", host_s);
    fmt::print("{}", tpu::sim::format_report(big_res.stats));
    return max_err < 1e-2 ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "main_example: {}\n", e.what());
    return 1;
  }
}
