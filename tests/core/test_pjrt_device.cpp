// The `pjrt` device type backed by libpjrt_tpucore_sim.so (the simulator as a PJRT plugin):
// the OpInfo suite and compiled functions on pjrt:0 against the independent references / the
// cpu, the single-op executable cache (counters), the host-fallback rule and its strict mode,
// and plugin loading errors (the runtime stays usable after each).
#include <dlfcn.h>

#include "opinfo.h"
#include "testing.h"
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"
#include "tpucore/runtime/pjrt_client.h"
#include "tpucore/streams.h"

namespace tpu::testing {
namespace {

using Catch::Matchers::Contains;

std::string lib_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(static_cast<void (*)(tpu::Device)>(&tpu::synchronize)), &info) && info.dli_fname) {
    std::string p = info.dli_fname;
    return p.substr(0, p.rfind('/') + 1);
  }
  return {};
}

void load_sim_pjrt() { load_pjrt_plugin(lib_dir() + "libpjrt_tpucore_sim.so"); }

struct StrictPjrt {  // host fallback off for a scope
  bool was = pjrt_host_fallback();
  StrictPjrt() { set_pjrt_host_fallback(false); }
  ~StrictPjrt() { set_pjrt_host_fallback(was); }
};

}  // namespace

TEST_CASE("pjrt device: the simulator plugin as pjrt:N", "[pjrt][pjrt-device]") {
  CHECK(Device("pjrt:1") == Device(DeviceType::pjrt, 1));
  load_sim_pjrt();
  REQUIRE(device_count(DeviceType::pjrt) >= 1);
  CHECK_THAT(device_properties(Device("pjrt:0")).name, Contains("pjrt:0"));
  CHECK_THAT(device_properties(Device("pjrt:0")).description, Contains("libpjrt_tpucore_sim.so"));
  // Host -> device -> host moves the bytes unchanged.
  const Tensor x = rn({3, 5}, 1);
  const Tensor d = x.to("pjrt:0");
  CHECK(d.device() == Device("pjrt:0"));
  CHECK(equal(d.to("cpu"), x));
  const int n = device_count(DeviceType::pjrt);
  CHECK_THROWS_WITH(ones({2}, TensorOptions(Device(DeviceType::pjrt, n))), Contains("out of range"));
}

TEST_CASE("pjrt device: every OpInfo entry on pjrt:0 matches its naive reference", "[pjrt][pjrt-device][opinfo]") {
  load_sim_pjrt();
  reset_pjrt_stats();
  for (const OpInfo& info : opinfo_table()) {
    DYNAMIC_SECTION(info.op << " on pjrt:0") { run_opinfo_entry(info, Device("pjrt:0")); }
  }
}

TEST_CASE("pjrt device: an eager op compiles once per signature and its buffers stay on the device", "[pjrt][pjrt-device]") {
  load_sim_pjrt();
  const Tensor a = rn({4, 7}, 2), b = rn({4, 7}, 3), c = rn({7, 3}, 4);
  const Tensor pa = a.to("pjrt:0"), pb = b.to("pjrt:0"), pc = c.to("pjrt:0");
  reset_pjrt_stats();
  Tensor s1 = pa * pb;
  PjrtStats st = pjrt_stats();
  CHECK(st.compiles == 1);
  CHECK(st.executions == 1);
  CHECK(st.uploads == 2);  // the two inputs, staged on the host by .to()
  CHECK(st.downloads == 0);
  Tensor s2 = pa * pb;  // same op, attrs, shapes, dtypes: no compile, no upload
  st = pjrt_stats();
  CHECK(st.compiles == 1);
  CHECK(st.cache_hits == 1);
  CHECK(st.uploads == 2);
  Tensor s3 = s1 * pb;  // reads an executable's output buffer in place
  st = pjrt_stats();
  CHECK(st.compiles == 1);
  CHECK(st.uploads == 2);
  Tensor m = matmul(s3, pc);  // another op: compiles
  CHECK(pjrt_stats().compiles == 2);
  (void)(rn({2, 2}, 5).to("pjrt:0") * rn({2, 2}, 6).to("pjrt:0"));  // another shape: compiles
  CHECK(pjrt_stats().compiles == 3);
  // Values against the cpu (a different code path: the cpu kernels, not the StableHLO module).
  CHECK(allclose(s2.to("cpu"), a * b, 1e-6, 1e-6));
  CHECK(allclose(s3.to("cpu"), a * b * b, 1e-6, 1e-6));
  CHECK(allclose(m.to("cpu"), matmul(a * b * b, c), 2e-2, 2e-2));  // the sim chip: one bf16 pass
  CHECK(pjrt_stats().downloads == 3);
  // A number operand is an argument of the cached executable, not a constant baked into it.
  CHECK(allclose((pa * 0.5f).to("cpu"), a * 0.5f));
  CHECK(allclose((pa * 3.0f).to("cpu"), a * 3.0f));
  // A host write after device results: the next read sees it.
  Tensor w = s1.clone();
  w.fill_(2.0f);
  CHECK(allclose((w * pb).to("cpu"), b * 2.0f));
}

TEST_CASE("pjrt device: compiled functions on pjrt:0 equal the cpu and sim:0", "[pjrt][pjrt-device][jit]") {
  load_sim_pjrt();
  const Tensor w = rn({6, 5}, 10), b = rn({5}, 11), x = rn({4, 6}, 12);
  auto f = tpu::compile([](const Tensor& x, const Tensor& w, const Tensor& b) {
    return softmax(relu(matmul(x, w) + b) * 0.5f, -1);
  });
  const Tensor want = f(x, w, b);
  const Tensor on_sim = f(x.to("sim:0"), w.to("sim:0"), b.to("sim:0")).to("cpu");
  reset_pjrt_stats();
  const Tensor px = x.to("pjrt:0"), pw = w.to("pjrt:0"), pb = b.to("pjrt:0");
  const Tensor got = f(px, pw, pb);
  // One executable for the whole function, no single-op executables.
  CHECK(pjrt_stats().graph_compiles == 1);
  CHECK(pjrt_stats().graph_runs == 1);
  CHECK(pjrt_stats().executions == 0);
  const Tensor again = f(px, pw, pb);
  CHECK(pjrt_stats().graph_compiles == 1);
  CHECK(pjrt_stats().graph_runs == 2);
  CHECK(equal(again.to("cpu"), got.to("cpu")));
  CHECK(got.device() == Device("pjrt:0"));
  CHECK(allclose(got.to("cpu"), want, 2e-2, 2e-2));
  CHECK(allclose(got.to("cpu"), on_sim, 1e-3, 1e-3));
  auto g = tpu::compile([](const Tensor& x) { return sum(x * x, {1}) + 1.0f; });
  const Tensor y = rn({3, 8}, 13);
  CHECK(allclose(g(y.to("pjrt:0")).to("cpu"), g(y), 1e-5, 1e-5));
  // A graph with an op that does not map (argmax) runs node by node, with the same values.
  auto h = tpu::compile([](const Tensor& x) { return argmax(x * 2.0f, 1); });
  reset_pjrt_stats();
  CHECK(equal(h(y.to("pjrt:0")).to("cpu"), argmax(y, 1)));
  CHECK(pjrt_stats().graph_compiles == 0);
  CHECK(pjrt_stats().host_fallbacks >= 1);  // argmax (the node-by-node run)
}

TEST_CASE("pjrt device: var and std export (decomposed) and run as executables", "[pjrt][pjrt-device][stablehlo]") {
  load_sim_pjrt();
  StrictPjrt strict;  // no host fallback: the executable must run them
  const Tensor x = rn({5, 9}, 30);
  const Tensor px = x.to("pjrt:0");
  // Reference: a naive two-pass loop in double.
  auto naive = [&](int64_t corr, bool sd) {
    std::vector<float> r;
    const Tensor c = x.contiguous();
    const float* p = c.data<float>();
    for (int i = 0; i < 5; ++i) {
      double m = 0, s = 0;
      for (int j = 0; j < 9; ++j) m += p[i * 9 + j];
      m /= 9;
      for (int j = 0; j < 9; ++j) s += (p[i * 9 + j] - m) * (p[i * 9 + j] - m);
      const double v = s / double(9 - corr);
      r.push_back(float(sd ? std::sqrt(v) : v));
    }
    return from_vector(r, {5});
  };
  CHECK(allclose(var(px, {1}).to("cpu"), naive(1, false), 1e-5, 1e-5));
  CHECK(allclose(tpu::std(px, {1}, 0).to("cpu"), naive(0, true), 1e-5, 1e-5));
  CHECK(allclose(var(px, {0, 1}, 1, true).to("cpu"), var(x, {0, 1}, 1, true), 1e-5, 1e-5));
}

TEST_CASE("pjrt device: arange exports as iota and runs as an executable", "[pjrt][pjrt-device][stablehlo]") {
  load_sim_pjrt();
  StrictPjrt strict;
  const Device d("pjrt:0");
  auto naive = [](double start, double step, int64_t n, DType t) {
    std::vector<float> f;
    std::vector<int64_t> k;
    for (int64_t i = 0; i < n; ++i) {
      f.push_back(float(start + step * double(i)));
      k.push_back(int64_t(start + step * double(i)));
    }
    return is_floating(t) ? from_vector(f, {n}).to(t) : from_vector(k, {n}).to(t);
  };
  CHECK(equal(arange(0, 10, 1, TensorOptions(DType::i64, d)).to("cpu"), naive(0, 1, 10, DType::i64)));
  CHECK(equal(arange(-3, 12, 4, TensorOptions(DType::i32, d)).to("cpu"), naive(-3, 4, 4, DType::i32)));
  CHECK(allclose(arange(0.5, 3.0, 0.25, TensorOptions(DType::f32, d)).to("cpu"), naive(0.5, 0.25, 10, DType::f32)));
}

TEST_CASE("pjrt device: unmapped ops fall back or fail by the rule, bad plugins are errors", "[pjrt][pjrt-device]") {
  load_sim_pjrt();
  const Tensor x = rn({3, 6}, 20);
  const Tensor px = x.to("pjrt:0");
  {
    StrictPjrt strict;
    CHECK_THROWS_WITH(argmax(px, 1), Contains("argmax") && Contains("does not run on 'pjrt:0'") &&
                                         Contains("Host fallback is off"));
  }
  reset_pjrt_stats();
  const Tensor am = argmax(px, 1);  // the host fallback rule: runs on the host, counted
  CHECK(pjrt_stats().host_fallbacks == 1);
  CHECK(equal(am.to("cpu"), argmax(x, 1)));
  CHECK(am.device() == Device("pjrt:0"));
  // Plugins that are not there, not PJRT plugins, or of an older API version.
  CHECK_THROWS_WITH(load_pjrt_plugin("/nonexistent/libtpu.so"), Contains("cannot load") && Contains("/nonexistent/libtpu.so"));
  CHECK_THROWS_WITH(load_pjrt_plugin("libm.so.6"), Contains("GetPjrtApi"));
  CHECK_THROWS_WITH(load_pjrt_plugin(lib_dir() + "libpjrt_old_version_test.so"), Contains("0.20") && Contains("0.33"));
  CHECK_THROWS_WITH(load_pjrt_plugin(""), Contains("empty path"));
  // The loaded driver stays in place and usable.
  CHECK(allclose((px + px).to("cpu"), x + x));
}

}  // namespace tpu::testing

namespace tpu::testing {

// Run by CTest with TPU_PJRT_PLUGIN set (tests/CMakeLists.txt): the plugin loads on first use.
TEST_CASE("pjrt device: TPU_PJRT_PLUGIN loads the plugin on first use", "[.pjrt-env]") {
  const char* env = std::getenv("TPU_PJRT_PLUGIN");
  REQUIRE(env != nullptr);
  const Tensor x = rn({4}, 50);
  if (std::string(env).find("/nonexistent/") != std::string::npos) {
    CHECK_THROWS_WITH(x.to("pjrt:0"), Contains("TPU_PJRT_PLUGIN") && Contains("cannot load"));
    CHECK_THROWS_WITH(device_count(DeviceType::pjrt), Contains("TPU_PJRT_PLUGIN"));
    CHECK(allclose(x + x, x * 2.0f));  // the runtime stays usable
    load_sim_pjrt();  // and an explicit load still works
  }
  CHECK(device_count(DeviceType::pjrt) >= 1);
  CHECK(allclose((x.to("pjrt:0") * 3.0f).to("cpu"), x * 3.0f));
}

}  // namespace tpu::testing
