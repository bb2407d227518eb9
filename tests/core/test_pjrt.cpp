// The PJRT path end to end: tpu::export_stablehlo writes a function as StableHLO, the PJRT
// client (tpucore/runtime/pjrt_client.h) loads libpjrt_tpucore_sim.so through GetPjrtApi, compiles
// the module and runs it on the plugin's device (sim:0: generated chip programs where the ops
// lower). Results are compared with the function run eagerly on the cpu (a different code path:
// the cpu kernels, not the StableHLO decompositions). Malformed modules, ops outside the
// subset and bad plugins are errors, and the client stays usable after them.
#include <dlfcn.h>

#include "codegen/launch.h"
#include "tpucore/runtime/pjrt_client.h"
#include "tpucore/export.h"
#include "testing.h"
#include "tpucore/devices.h"
#include "tpucore/streams.h"
#include "tpucore/compile.h"
#include "tpucore/ops.h"

namespace tpu::testing {
namespace {

using Catch::Matchers::Contains;
using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

std::string plugin_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(static_cast<void (*)(tpu::Device)>(&tpu::synchronize)), &info) && info.dli_fname) {
    std::string p = info.dli_fname;
    return p.substr(0, p.rfind('/') + 1) + "libpjrt_tpucore_sim.so";
  }
  return "libpjrt_tpucore_sim.so";
}

std::shared_ptr<pjrt::Client> client() {
  static std::shared_ptr<pjrt::Client> c = pjrt::Client::load(plugin_path());
  return c;
}

void round_trip(const char* what, const Fn& fn, const std::vector<Tensor>& in, double tol) {
  INFO(what);
  const std::vector<Tensor> want = fn(in);
  auto exe = client()->compile(export_stablehlo(fn, in));
  REQUIRE(exe->num_outputs() == want.size());
  const std::vector<Tensor> got = exe->execute(in);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("output " << i);
    REQUIRE(got[i].shape() == want[i].shape());
    REQUIRE(got[i].dtype() == want[i].dtype());
    if (want[i].dtype() == DType::boolean) CHECK(equal(got[i], want[i]));
    else CHECK(allclose(got[i].to(DType::f32), want[i].to(DType::f32), tol, tol));
  }
}

}  // namespace

TEST_CASE("pjrt: the simulator plugin through the PJRT C API", "[pjrt]") {
  auto c = client();
  CHECK(c->platform_name() == "tpucore_sim");
  CHECK(c->device_count() == device_count(DeviceType::sim));
  CHECK(c->api_major() == 0);
  CHECK(c->api_minor() >= 33);
}

TEST_CASE("pjrt: exported functions compute the cpu's values on the plugin", "[pjrt][stablehlo]") {
  const Tensor w1 = rn({32, 16}, 1), b1 = rn({32}, 2), w2 = rn({8, 32}, 3);
  const uint64_t runs0 = codegen::stats().runs;
  round_trip("mlp (captured weights, exact gelu)",
             [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{linear(gelu(linear(a[0], w1, b1)), w2)}; },
             {rn({4, 16}, 4)}, 1e-4);
  CHECK(codegen::stats().runs > runs0);  // the plugin ran generated chip programs
  round_trip("elementwise, compare, select, clamp, convert",
             [](const std::vector<Tensor>& a) {
               Tensor y = where(a[0] > a[1], exp(a[0]) * 2.0, tanh(a[1]) - a[0]);
               return std::vector<Tensor>{clamp(sigmoid(y), 0.1, 0.9).to(DType::bf16), logical_not(le(a[0], 0.0))};
             },
             {rn({5, 7}, 5), rn({7}, 6)}, 1e-2);
  round_trip("batched matmul and reductions",
             [](const std::vector<Tensor>& a) {
               Tensor m = matmul(a[0], a[1]);
               return std::vector<Tensor>{sum(m, {-1}), mean(m, {0, 2}, true), amax(m), amin(m, {1})};
             },
             {rn({2, 3, 4, 5}, 7), rn({3, 5, 6}, 8)}, 1e-4);
  round_trip("softmax, log_softmax, norms",
             [](const std::vector<Tensor>& a) {
               return std::vector<Tensor>{softmax(a[0], -1), log_softmax(a[0], 0), layer_norm(a[0], {10}, a[1], a[2]),
                                          rms_norm(a[0], {10}, a[1])};
             },
             {rn({3, 10}, 9), rn({10}, 10), rn({10}, 11)}, 1e-4);
  round_trip("views and joins",
             [](const std::vector<Tensor>& a) {
               Tensor t = a[0].transpose(0, 1).contiguous().reshape({3, 8});
               return std::vector<Tensor>{t, cat({a[1].slice(1, 1, 6, 2), a[0]}, 1), stack({a[0], a[1]}, 0),
                                          a[1].select(0, 2), a[0].unsqueeze(0).expand({2, 4, 6})};
             },
             {rn({4, 6}, 12), rn({4, 6}, 13)}, 0);
  round_trip("rotary embedding and causal grouped-query attention",
             [](const std::vector<Tensor>& a) {
               Tensor q = rotary_embedding(a[0], cos(a[3]), sin(a[3]));
               return std::vector<Tensor>{scaled_dot_product_attention(q, a[1], a[2], {}, true)};
             },
             {rn({1, 4, 6, 8}, 14), rn({1, 2, 6, 8}, 15), rn({1, 2, 6, 8}, 16), rn({6, 8}, 17)}, 1e-4);
  // The MLIR 14 attribute syntax runs too.
  auto exe = client()->compile(export_stablehlo([](const std::vector<Tensor>& a) { return a[0] * a[0] + 1.0; },
                                                {rn({3}, 18)}, {.syntax = StableHloSyntax::mlir14}));
  const Tensor x = rn({3}, 19);
  CHECK(allclose(exe->execute({x})[0], x * x + 1.0));
}

TEST_CASE("pjrt: a tpu::compile'd function exported and run through PJRT", "[pjrt][stablehlo][jit]") {
  const Tensor w = rn({6, 5}, 40);
  auto f = tpu::compile([&](const Tensor& x, const Tensor& b) { return relu(matmul(x, w) + b); });
  const Tensor x = rn({4, 6}, 41), b = rn({5}, 42);
  const Tensor want = f(x, b);  // the compiled function on the cpu
  auto exe = client()->compile(export_stablehlo(f, {x, b}));
  CHECK(allclose(exe->execute({x, b})[0], want, 1e-5, 1e-5));
  CHECK_THROWS_WITH(export_stablehlo(f, {x}), Contains("does not take 1 Tensor"));
}

TEST_CASE("pjrt: malformed modules, unsupported ops and bad plugins are errors", "[pjrt]") {
  auto c = client();
  CHECK_THROWS_WITH(c->compile("this is not MLIR"), Contains("PJRT_Client_Compile") && Contains("line 1"));
  const std::string ok = export_stablehlo([](const std::vector<Tensor>& a) { return a[0] + a[0]; }, {rn({2}, 1)});
  std::string broken = ok;
  broken.replace(broken.find("tensor<2xf32>"), 13, "tensor<2xq99>");
  CHECK_THROWS_WITH(c->compile(broken), Contains("element type 'q99'"));
  std::string unknown = ok;
  unknown.replace(unknown.find("stablehlo.add"), 13, "stablehlo.fft");
  auto exe = c->compile(unknown);
  CHECK_THROWS_WITH(exe->execute({rn({2}, 2)}), Contains("stablehlo.fft") && Contains("outside the subset"));
  std::string no_return = ok.substr(0, ok.find("    \"func.return\""));
  CHECK_THROWS_WITH(c->compile(no_return), Contains("func.return"));
  auto good = c->compile(ok);
  CHECK_THROWS_WITH(good->execute({rn({3}, 3)}), Contains("argument 0") && Contains("expects"));
  CHECK_THROWS_WITH(good->execute({}), Contains("1 argument"));
  CHECK_THROWS_WITH(good->execute({rn({2}, 3)}, 99), Contains("device 99"));
  CHECK_THROWS_WITH(pjrt::Client::load("/nonexistent/libtpu.so"), Contains("cannot load") && Contains("/nonexistent/libtpu.so"));
  CHECK_THROWS_WITH(pjrt::Client::load("libm.so.6"), Contains("not a PJRT plugin") && Contains("GetPjrtApi"));
  // Still usable.
  const Tensor x = rn({2}, 4);
  CHECK(allclose(good->execute({x})[0], x + x));
}

}  // namespace tpu::testing
