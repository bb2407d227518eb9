// An MLP block on the simulated chip through ordinary tensors: x and the weights live in the
// HBM of sim:0, the block runs eagerly (each op lowered to a chip program) and compiled
// (tpu::compile fuses the matmul epilogues into the MXU kernels), both are checked against the
// same block on the cpu, and the profiler prints its per-op table (host time, chip cycles,
// FLOPs, HBM bytes) and writes one Chrome/Perfetto trace with the host ops and the chip units.
//
//   sim_mlp [--chip v5e] [--tokens 256] [--hidden 512] [--trace mlp_trace.json]
#include <fmt/core.h>

#include <cmath>
#include <string>

#include "ops/fallback.h"
#include "tools/cli_args.h"
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"
#include "tpucore/profiler.h"
#include "tpucore/streams.h"

using namespace tpu;

namespace {

struct Block {
  Tensor w1, b1, w2, b2;
  // y = x + W2 gelu(W1 x + b1) + b2
  Tensor operator()(const Tensor& x) const { return add(x, linear(gelu(linear(x, w1, b1)), w2, b2)); }
};

double max_rel_error(const Tensor& got, const Tensor& ref) {
  const auto g = got.to("cpu").to(DType::f32).to_vector<float>();
  const auto r = ref.to_vector<float>();
  double worst = 0, scale = 1e-6;
  for (float v : r) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(g[i]) - r[i]) / scale);
  return worst;
}

double chip_cycles(const profiler::Profile& p) {
  double c = 0;
  for (const auto& r : p.key_averages()) c += r.chip_cycles;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  std::string chip = "v5e", trace = "mlp_trace.json";
  int64_t tokens = 256, hidden = 512;
  cli::Parser args("sim_mlp",
                   "An MLP block on sim:0 through ordinary tensors, eager and compiled, checked against the cpu,\n"
                   "with the profiler's per-op table and a Chrome/Perfetto trace.");
  args.value("--chip", "NAME", "chip preset of sim:0 (default v5e)", [&](const std::string& v) { chip = v; });
  args.value("--tokens", "N", "rows of the input (default 256)", [&](const std::string& v) { tokens = args.to_int(v); });
  args.value("--hidden", "N", "model width; the FFN is 4x (default 512)",
             [&](const std::string& v) { hidden = args.to_int(v); });
  args.value("--trace", "FILE", "trace output (default mlp_trace.json)", [&](const std::string& v) { trace = v; });
  if (auto rc = args.parse(argc, argv)) return *rc;
  try {
    set_sim_chip(chip);
    const Device dev("sim:0");
    const DeviceProperties props = device_properties(dev);
    fmt::print("device {}: {}\n", dev.str(), props.description);
    manual_seed(7);
    const int64_t ffn = 4 * hidden;
    const float s1 = 1.0f / std::sqrt(static_cast<float>(hidden)), s2 = 1.0f / std::sqrt(static_cast<float>(ffn));
    Block cpu{mul(randn({ffn, hidden}), s1), mul(randn({ffn}), 0.1f), mul(randn({hidden, ffn}), s2),
              mul(randn({hidden}), 0.1f)};
    Tensor x = randn({tokens, hidden});
    const Tensor ref = cpu(x);  // the same block on the host (f32)

    Block sim{cpu.w1.to(dev), cpu.b1.to(dev), cpu.w2.to(dev), cpu.b2.to(dev)};
    Tensor xs = x.to(dev);
    fmt::print("MLP block: x[{}, {}] -> Linear {} + gelu -> Linear {} + residual, f32 tensors in HBM\n", tokens, hidden,
               ffn, hidden);

    profiler::Profile eager_prof;
    Tensor y_eager = sim(xs);
    synchronize(dev);
    eager_prof.stop();
    const double e_err = max_rel_error(y_eager, ref);
    fmt::print("\n== eager on {} (each op one chip program): max error vs cpu {:.2e} (of the output's scale)\n",
               dev.str(), e_err);
    fmt::print("{}", eager_prof.table());

    auto block = compile([&](const Tensor& in) { return sim(in); }, {.name = "mlp_block"});
    (void)block(xs);  // first call: trace, optimize, generate the kernels
    synchronize(dev);  // its chip program done before the profile starts
    profiler::Profile comp_prof;
    Tensor y_comp = block(xs);
    synchronize(dev);
    comp_prof.stop();
    const double c_err = max_rel_error(y_comp, ref);
    fmt::print("\n== compiled on {} (fused matmul epilogues): max error vs cpu {:.2e}\n", dev.str(), c_err);
    fmt::print("{}", comp_prof.table());

    const double ce = chip_cycles(eager_prof), cc = chip_cycles(comp_prof);
    fmt::print("\nchip cycles: eager {:.0f}, compiled {:.0f} ({:.2f}x fewer); host fallbacks: {}\n", ce, cc,
               cc > 0 ? ce / cc : 0.0, ops::total_fallbacks());
    comp_prof.export_chrome_trace(trace);
    fmt::print("trace of the compiled run (host ops + chip units): {} (open in https://ui.perfetto.dev)\n", trace);
    // bf16 MXU inputs: about 3 significant digits.
    if (e_err > 3e-2 || c_err > 3e-2) {
      fmt::print(stderr, "FAILED: sim results differ from the cpu beyond bf16 tolerance\n");
      return 1;
    }
    fmt::print("OK: eager and compiled sim results match the cpu within bf16 tolerance\n");
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
