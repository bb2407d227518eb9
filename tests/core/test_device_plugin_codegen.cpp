// tpucore's generated programs through the driver plugin ABI (version 2): the simulator built as
// a plugin (libtpusim_plugin.so) loaded as `tpu` describes its chip (device_target), so the
// eager lowerings and the compiled regions run on tpu:0 as the same programs as on sim:0, with
// their arguments passed through TpuProgramRunArgs. Each case checks tpu:0 against sim:0 (the
// in-tree driver, a different code path: programs handed over as objects, not JSON text through
// the C ABI), bit for bit and cycle for cycle, and against the cpu within a tolerance.
#include <dlfcn.h>

#include <functional>

#include "codegen_testing.h"
#include "device/plugin_abi.h"
#include "device/plugin_loader.h"
#include "jit_testing.h"
#include "sim/config.h"

#include <nlohmann/json.hpp>
#include "tpucore/compile.h"

namespace tpu::testing {
namespace {

using Catch::Matchers::Contains;

const Device kSim("sim:0"), kTpu("tpu:0");

// The plugin is unloaded again when the test case ends (test_device_plugin.cpp's listener).
void load_sim_plugin() { load_driver_plugin("libtpusim_plugin.so", DeviceType::tpu); }

struct RunResult {
  Tensor out;  // on the cpu
  double cycles = 0;
  uint64_t runs = 0, fallbacks = 0;
};

RunResult run_on(const Device& d, const std::vector<Tensor>& host_inputs,
                 const std::function<Tensor(const std::vector<Tensor>&)>& fn) {
  std::vector<Tensor> in;
  for (const Tensor& t : host_inputs) in.push_back(t.to(d));
  synchronize(d);
  const codegen::CodegenStats s0 = codegen::stats();
  const uint64_t f0 = ops::total_fallbacks();
  Tensor out = fn(in);
  synchronize(d);
  const codegen::CodegenStats s1 = codegen::stats();
  RunResult r;
  r.out = out.to("cpu");
  r.cycles = s1.cycles - s0.cycles;
  r.runs = s1.runs - s0.runs;
  r.fallbacks = ops::total_fallbacks() - f0;
  return r;
}

struct PluginCase {
  const char* name;
  std::vector<Shape> shapes;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  double tol = 1e-5;
};

void check_same(const PluginCase& c, const RunResult& sim, const RunResult& tpu, const Tensor& cpu) {
  INFO(c.name);
  CHECK(tpu.fallbacks == 0);
  CHECK(tpu.runs >= 1);
  CHECK(tpu.runs == sim.runs);
  CHECK(tpu.cycles > 0);
  // The same programs on the same chip (the counters are running sums: differences of two sums
  // round differently in the last bits).
  CHECK(tpu.cycles == Approx(sim.cycles).epsilon(1e-12));
  REQUIRE(tpu.out.shape() == sim.out.shape());
  CHECK(equal(tpu.out, sim.out));  // bit for bit
  CHECK(allclose(tpu.out.to(DType::f32), cpu.to(DType::f32), c.tol, c.tol));
}

}  // namespace

TEST_CASE("plugin codegen: eager ops on tpu:0 equal sim:0 in values and cycles", "[device][codegen]") {
  load_sim_plugin();
  REQUIRE(codegen::runs_generated_programs(kTpu));
  // The chip the plugin describes is the one sim:0 simulates.
  CHECK(codegen::chip_config(kTpu).name == codegen::chip_config(kSim).name);
  CHECK(sim::config_to_json(codegen::chip_config(kTpu)) == sim::config_to_json(codegen::chip_config(kSim)));
  const double bf = 2e-2;
  const std::vector<PluginCase> cases = {
      {"add", {{37, 50}, {37, 50}}, [](const std::vector<Tensor>& v) { return v[0] + v[1]; }},
      {"sub alpha (runtime scalar)", {{64, 33}, {64, 33}}, [](const std::vector<Tensor>& v) { return sub(v[0], v[1], 0.75); }},
      {"mul broadcast row", {{16, 40}, {40}}, [](const std::vector<Tensor>& v) { return v[0] * v[1]; }},
      {"div", {{300}, {300}}, [](const std::vector<Tensor>& v) { return v[0] / (abs(v[1]) + 1.0); }},
      {"exp tanh sigmoid", {{8, 130}}, [](const std::vector<Tensor>& v) { return exp(v[0] * 0.5) + tanh(v[0]) + sigmoid(v[0]); }},
      {"gelu silu relu", {{129, 7}}, [](const std::vector<Tensor>& v) { return gelu(v[0]) + silu(v[0]) + relu(v[0]); }},
      {"where gt clamp", {{20, 30}, {20, 30}}, [](const std::vector<Tensor>& v) { return where(v[0] > v[1], clamp(v[0], -0.5, 0.5), v[1]); }},
      {"to bf16", {{40, 40}}, [](const std::vector<Tensor>& v) { return v[0].to(DType::bf16); }, bf},
      {"sum over last dim", {{12, 300}}, [](const std::vector<Tensor>& v) { return sum(v[0], {1}); }, 1e-4},
      {"mean over first dim (permuted)", {{50, 24}}, [](const std::vector<Tensor>& v) { return mean(v[0], {0}); }, 1e-4},
      {"amax", {{6, 7, 9}}, [](const std::vector<Tensor>& v) { return amax(v[0], {-1}); }},
      {"softmax", {{10, 70}}, [](const std::vector<Tensor>& v) { return softmax(v[0], -1); }},
      {"log_softmax", {{3, 5, 33}}, [](const std::vector<Tensor>& v) { return log_softmax(v[0], -1); }, 1e-4},
      {"layer_norm", {{9, 64}, {64}, {64}}, [](const std::vector<Tensor>& v) { return layer_norm(v[0], {64}, v[1], v[2]); }, 1e-4},
      {"rms_norm", {{9, 48}, {48}}, [](const std::vector<Tensor>& v) { return rms_norm(v[0], {48}, v[1]); }, 1e-4},
      {"matmul", {{33, 70}, {70, 20}}, [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); }, 1e-4},
      {"linear with bias", {{2, 17, 64}, {48, 64}, {48}}, [](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); }, 1e-4},
      {"bf16 matmul", {{32, 64}, {64, 32}}, [](const std::vector<Tensor>& v) { return matmul(v[0].to(DType::bf16), v[1].to(DType::bf16)); }, 5e-2},
      {"transpose contiguous", {{24, 40}}, [](const std::vector<Tensor>& v) { return v[0].transpose(0, 1).contiguous(); }},
      {"causal attention", {{1, 2, 16, 32}, {1, 2, 16, 32}, {1, 2, 16, 32}},
       [](const std::vector<Tensor>& v) { return scaled_dot_product_attention(v[0], v[1], v[2], {}, true); }, 1e-4},
      {"rotary_embedding", {{2, 8, 16}, {8, 16}, {8, 16}}, [](const std::vector<Tensor>& v) { return rotary_embedding(v[0], v[1], v[2]); }, 1e-5},
  };
  uint64_t seed = 100;
  for (const PluginCase& c : cases) {
    std::vector<Tensor> host;
    for (const Shape& s : c.shapes) host.push_back(jit_testing::rnd(s, ++seed));
    const Tensor cpu = c.fn(host);
    const RunResult sim = run_on(kSim, host, c.fn);
    const RunResult tpu = run_on(kTpu, host, c.fn);
    check_same(c, sim, tpu, cpu);
  }
}

TEST_CASE("plugin codegen: compiled functions on tpu:0 equal sim:0 in values and cycles", "[device][codegen][jit]") {
  load_sim_plugin();
  struct Compiled {
    const char* name;
    const char* region;  // the fused kernel the compiled function must run
    std::vector<Shape> shapes;
    std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&)> fn;
  };
  const std::vector<Compiled> fns = {
      {"mlp", "region:mlp", {{2, 6, 16}, {32, 16}, {32}, {16, 32}},
       [](const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2) {
         return x + linear(gelu(linear(x, w1, b1)), w2);
       }},
      {"matmul epilogue", "region:matmul", {{20, 24}, {40, 24}, {40}, {20, 40}},
       [](const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& r) { return silu(linear(x, w, b)) + r; }},
      {"elementwise chain", "region:elementwise", {{33, 20}, {20}, {33, 20}, {1}},
       [](const Tensor& x, const Tensor& w, const Tensor& y, const Tensor&) { return sigmoid(x * w + 0.5) * y; }},
      {"rowwise with prologue", "region:rowwise", {{12, 40}, {40}, {12, 40}, {1}},
       [](const Tensor& x, const Tensor& w, const Tensor& y, const Tensor&) { return softmax(x * w + y, -1) * 2.0; }},
  };
  uint64_t seed = 500;
  for (const Compiled& c : fns) {
    INFO(c.name);
    std::vector<Tensor> host;
    for (const Shape& s : c.shapes) host.push_back(jit_testing::rnd(s, ++seed));
    const Tensor cpu = c.fn(host[0], host[1], host[2], host[3]);
    auto f = tpu::compile(c.fn, {.name = std::string("plugin_") + c.name});
    auto run = [&](const Device& d) {
      std::vector<Tensor> in;
      for (const Tensor& t : host) in.push_back(t.to(d));
      (void)f(in[0], in[1], in[2], in[3]);  // traces (per device: the device is in the key)
      synchronize(d);
      const uint64_t region0 = codegen::stats().runs_by_kernel[c.region];
      RunResult r = run_on(d, {}, [&](const std::vector<Tensor>&) { return f(in[0], in[1], in[2], in[3]); });
      CHECK(codegen::stats().runs_by_kernel[c.region] == region0 + 1);
      return r;
    };
    const RunResult sim = run(kSim);
    const RunResult tpu = run(kTpu);
    check_same(PluginCase{c.name, {}, {}, 1e-4}, sim, tpu, cpu);
  }
}

TEST_CASE("plugin codegen: a plugin of ABI version 1 is refused, naming the versions", "[device]") {
  CHECK_THROWS_WITH(load_driver_plugin("libtpu_old_abi_plugin.so", DeviceType::tpu),
                    Contains("old-abi-test-plugin") && Contains("ABI version 1") && Contains("version 2") &&
                        Contains("arguments") && Contains("rebuild"));
  CHECK_FALSE((device::driver_present(DeviceType::tpu) && device::driver_for(DeviceType::tpu).name() == "old-abi-test-plugin"));
  // The runtime stays usable: the current plugin loads and runs programs.
  load_sim_plugin();
  CHECK(sum(ones({100}, kTpu)).item().to_double() == 100.0);
}

TEST_CASE("plugin codegen: program arguments and the chip description through the C ABI", "[device]") {
  load_sim_plugin();
  device::Driver& drv = device::driver_for(kTpu);
  // device_target: the chip config JSON the plugin generates programs for.
  const std::string target = drv.program_target(0);
  CHECK(sim::config_from_json_text(target).name == codegen::chip_config(kSim).name);
  // Arguments land in the scalar registers: a DMA addressed by r0 and r1 copies 512 bytes.
  std::vector<float> v(128);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f;
  Tensor a = from_vector(v).to(kTpu), b = zeros({128}, kTpu);
  const auto p = drv.load_program(0, "dma dst=hbm[r1] src=hbm[r0] shape=[1,1,512] q=0 sem=0\nwait sem=0 n=1\n");
  auto st = std::make_shared<device::ProgramStats>();
  device::ProgramOptions o;
  o.args = {codegen::hbm_address(a), codegen::hbm_address(b)};
  drv.enqueue_program(0, 0, p, o, st);
  CHECK(b.to_vector<float>() == v);
  drv.synchronize(0);
  CHECK(st->done);
  CHECK(st->cycles > 0);
  CHECK(st->dma_bytes == 512);
  // More arguments than the chip has scalar registers: a clear error, and the device still works.
  o.args.assign(size_t(codegen::chip_config(kTpu).scalar.registers) + 1, 0);
  CHECK_THROWS_WITH(drv.enqueue_program(0, 0, p, o, nullptr),
                    Contains("tpu:0") && Contains("program_run") && Contains("scalar registers"));
  drv.unload_program(0, p);
  CHECK(sum(ones({7}, kTpu)).item().to_double() == 7.0);
}

}  // namespace tpu::testing
