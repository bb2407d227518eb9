// Megacore in codegen: on a device of two TensorCores, matmul tiles and the rows of elementwise
// and row-wise kernels are split between the cores. Values against the one-core path (same
// arithmetic, so equal bit for bit) and a naive double loop; the split decision on program
// structure; cycles of a large matmul against the one-core streaming bound (v4, ideal model).
#include <nlohmann/json.hpp>

#include "codegen/elementwise_kernel.h"
#include "codegen/megacore.h"
#include "codegen_testing.h"
#include "sim/presets.h"
#include "tpucore/ops.h"

namespace tpu::testing {
namespace {

// The tiny chip as one device of two cores.
std::string tiny2_json() {
  auto j = nlohmann::json::parse(sim::preset_json("tiny"));
  j["name"] = "tiny2";
  j["cores_per_chip"] = 2;
  j["timing"]["megacore"] = 2;
  return j.dump();
}

struct Chip1 {
  std::string prev = device::sim_chip(1);
  explicit Chip1(const std::string& chip) { set_sim_chip(chip, 1); }
  ~Chip1() {
    try {
      set_sim_chip(prev, 1);
    } catch (...) {
    }
  }
};

std::vector<float> on_chip(const std::string& chip, const std::function<Tensor(const Device&)>& f) {
  Chip1 c(chip);
  return f(Device("sim:1")).to(Device("cpu")).to(DType::f32).contiguous().to_vector<float>();
}

}  // namespace

TEST_CASE("codegen megacore: big kernels split over both cores, small ones stay on one", "[codegen][megacore]") {
  const sim::ChipConfig two = sim::config_from_json_text(tiny2_json());
  codegen::MatmulSpec big{.m = 256, .n = 64, .k = 64};
  const sim::Program p = codegen::make_matmul_program(two, big);
  REQUIRE(p.cores.size() == 2);
  CHECK(p.code.empty());
  codegen::MatmulSpec small{.m = 8, .n = 8, .k = 8};
  CHECK(codegen::make_matmul_program(two, small).cores.empty());
  // The same matmul on a one-core chip is one program.
  CHECK(codegen::make_matmul_program(sim::preset_config("tiny"), big).cores.empty());
  // Threshold: half the one-core estimate against one DMA latency.
  CHECK(codegen::megacore_cores(two, 2 * two.dma.latency_cycles + 1) == 2);
  CHECK(codegen::megacore_cores(two, 2 * two.dma.latency_cycles) == 1);
  CHECK(codegen::megacore_cores(sim::preset_config("tiny"), 1e9) == 1);
}

TEST_CASE("codegen megacore: values equal the one-core path and a naive loop", "[codegen][megacore]") {
  Generator g(5);
  const std::string two = tiny2_json();
  struct Case {
    int64_t m, n, k;
  };
  for (Case c : {Case{200, 24, 40}, Case{67, 40, 16}, Case{5, 9, 7}}) {
    Tensor a = make_input(g, {c.m, c.k}, DType::f32, Layout::contiguous);
    Tensor b = make_input(g, {c.k, c.n}, DType::f32, Layout::contiguous);
    auto run = [&](const Device& d) { return tpu::matmul(a.to(d), b.to(d)); };
    const auto split = on_chip(two, run), one = on_chip("tiny", run);
    CHECK(split == one);
    const auto av = a.to_vector<float>(), bv = b.to_vector<float>();
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double ref = 0;
        for (int64_t k = 0; k < c.k; ++k) ref += double(av[size_t(i * c.k + k)]) * bv[size_t(k * c.n + j)];
        INFO(c.m << "x" << c.n << "x" << c.k << " at " << i << "," << j);
        REQUIRE(split[size_t(i * c.n + j)] == Approx(ref).margin(1e-4));
      }
  }
  // Elementwise (with a row-vector broadcast) and row-wise kernels: split rows.
  Tensor x = make_input(g, {300, 40}, DType::f32, Layout::contiguous);
  Tensor y = make_input(g, {40}, DType::f32, Layout::contiguous);
  auto ew = [&](const Device& d) { return tpu::relu(tpu::add(x.to(d), y.to(d))); };
  const auto ew_split = on_chip(two, ew), ew_one = on_chip("tiny", ew);
  CHECK(ew_split == ew_one);
  const auto xv = x.to_vector<float>(), yv = y.to_vector<float>();
  for (size_t i = 0; i < xv.size(); ++i) REQUIRE(ew_split[i] == std::max(0.f, xv[i] + yv[i % 40]));
  auto sm = [&](const Device& d) { return tpu::softmax(x.to(d), 1); };
  CHECK(on_chip(two, sm) == on_chip("tiny", sm));
  auto rs = [&](const Device& d) { return tpu::sum(x.to(d), {1}); };
  const auto rs_split = on_chip(two, rs);
  CHECK(rs_split == on_chip("tiny", rs));
  for (int64_t i = 0; i < 300; ++i) {
    double ref = 0;
    for (int64_t j = 0; j < 40; ++j) ref += xv[size_t(i * 40 + j)];
    REQUIRE(rs_split[size_t(i)] == Approx(ref).margin(1e-4));
  }
}

TEST_CASE("codegen megacore: a large matmul on v4 takes about half the one-core bound", "[codegen][megacore]") {
  Chip1 chip("v4-ideal");
  const Device d("sim:1");
  const int64_t m = 4096, n = 2048, k = 2048;
  const bool was = codegen::timing_only();
  codegen::set_timing_only(true);
  Tensor a = tpu::zeros({m, k}, {DType::bf16, d}), b = tpu::zeros({k, n}, {DType::bf16, d});
  (void)tpu::matmul(a, b);  // builds the program
  ChipRunProbe probe;
  (void)tpu::matmul(a, b);
  const double cycles = probe.new_cycles();
  codegen::set_timing_only(was);
  // One core streams every row of A through its 4 MXUs once per (K tile, N tile): m k n / (128^2 4)
  // cycles at one row per cycle. Two cores can at best halve it.
  const sim::ChipConfig v4 = sim::preset_config("v4-ideal");
  const double one_core = double(m) * double(k / 128) * double(n / 128) / 4 * v4.mxu.bf16_cycles_per_row;
  INFO("cycles " << cycles << ", one-core streaming bound " << one_core);
  CHECK(cycles >= 0.5 * one_core);
  CHECK(cycles <= 0.56 * one_core);
}

}  // namespace tpu::testing
