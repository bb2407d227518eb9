// Out-of-tree drivers: the simulator built as a plugin (libtpusim_plugin.so) loaded as the
// `tpu` device type and used through the C ABI; a wrong ABI version, a library that is not a
// plugin, a missing driver, and TPU_DRIVER_PATH (checked in child processes of this binary,
// since a loaded driver cannot be unloaded).
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // for the listener below
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "device/driver.h"
#include "device/plugin_abi.h"
#include "device/plugin_loader.h"
#include "ops/fallback.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

extern char** environ;

using namespace tpu;
using Catch::Matchers::Contains;

namespace {

constexpr const char* kSimPlugin = "libtpusim_plugin.so";

void ensure_plugin() { load_driver_plugin(kSimPlugin, DeviceType::tpu); }

// Every test case starts with the drivers the environment gives: a plugin a test case loaded
// explicitly is unloaded when it ends (other tests check `tpu` without a driver).
struct UnloadTestPlugins : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseEnded(const Catch::TestCaseStats&) override { device::unload_driver_plugin(DeviceType::tpu); }
};

// Runs this test binary on one hidden test case with TPU_CHILD_CASE=`what` and
// TPU_DRIVER_PATH=`driver_path` (unset when empty); returns its exit status.
int run_child(const std::string& what, const std::string& driver_path) {
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "TPU_DRIVER_PATH=", 16) != 0 && std::strncmp(*e, "TPU_CHILD_CASE=", 15) != 0) env_s.push_back(*e);
  env_s.push_back("TPU_CHILD_CASE=" + what);
  if (!driver_path.empty()) env_s.push_back("TPU_DRIVER_PATH=" + driver_path);
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", tag = "[.device-child]";
  std::string arg0 = "tpucore_tests";
  char* argv[] = {arg0.data(), tag.data(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
}

}  // namespace

CATCH_REGISTER_LISTENER(UnloadTestPlugins)

TEST_CASE("plugin: tensors on tpu:0 run on the simulator through the driver ABI", "[device]") {
  ensure_plugin();
  const Device t("tpu:0");
  CHECK(device_count(DeviceType::tpu) >= 1);
  const DeviceProperties p = device_properties(t);
  CHECK_THAT(p.name, Contains("tpu:0") && Contains("tpusim"));
  CHECK(p.memory_bytes > 0);
  CHECK(p.compute_units > 0);
  CHECK(memory_free(t) <= p.memory_bytes);

  std::vector<float> v(300);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 17) - 8.0f;
  Tensor h = from_vector(v, {15, 20});
  Tensor x = h.to(t);
  CHECK(x.device() == t);
  CHECK(x.to_vector<float>() == v);
  CHECK(clone(x).to_vector<float>() == v);  // HBM -> HBM inside the plugin
  // Lowered ops run as generated programs through the ABI (no host fallback) and give the cpu's
  // answers (test_device_plugin_codegen.cpp compares them with sim:0 op by op).
  const uint64_t before = ops::total_fallbacks();
  Tensor y = add(mul(x, x), 1.0);
  CHECK(y.device() == t);
  CHECK(equal(y.to("cpu"), add(mul(h, h), 1.0)));
  Tensor m = matmul(x, x.transpose(0, 1));
  CHECK(allclose(m.to("cpu"), matmul(h, h.transpose(0, 1)), 1e-5, 1e-4));
  CHECK(ops::total_fallbacks() == before);
  // An op without a lowering still falls back to the host (counted).
  CHECK(equal(sin(x).to("cpu"), sin(h)));
  CHECK(ops::total_fallbacks() > before);
  CHECK(x.to("sim:0").to_vector<float>() == v);  // between two drivers, through the host

  // Out of memory through the ABI: named with the device and the bytes.
  CHECK_THROWS_WITH(empty({int64_t(1) << 42}, TensorOptions(DType::u8, t)),
                    Contains("tpu:0") && Contains("out of device memory") && Contains("4398046511104 bytes"));
  CHECK(ones({2}, t).sum().item().to_double() == 2.0);
  // A bad index names the device and the count.
  const int n = device_count(DeviceType::tpu);
  CHECK_THROWS_WITH(zeros({2}, Device("tpu:" + std::to_string(n))), Contains("tpu:" + std::to_string(n)) &&
                                                                         Contains(std::to_string(n) + " tpu device"));
}

TEST_CASE("plugin: programs, streams and events through the ABI", "[device]") {
  const bool sync = synchronous_mode();
  set_synchronous_mode(false);  // checks an asynchronous error below
  ensure_plugin();
  const Device t("tpu:0");
  device::Driver& drv = device::driver_for(t);
  REQUIRE(drv.runs_programs());
  std::vector<float> v(128, 2.5f);
  Tensor a = from_vector(v).to(t), b = zeros({128}, t);
  auto addr = [](const Tensor& x) { return reinterpret_cast<uintptr_t>(x.storage()->data); };
  const auto cp = drv.load_program(
      0, fmt::format("dma dst=hbm[{}] src=hbm[{}] shape=[1,1,512] q=0 sem=0\nwait sem=0 n=1\n", addr(b), addr(a)));
  const auto lp = drv.load_program(0, "dma dst=hbm[4294967296] src=hbm[8589934592] shape=[16,1024,16384] q=0 sem=0\n"
                                      "wait sem=0 n=1\n");
  Stream A = Stream::create(t), B = Stream::create(t);
  Event e0, eA, eB;
  auto st = std::make_shared<device::ProgramStats>();
  e0.record(A);
  drv.enqueue_program(0, A.id(), lp, {.timing_only = true}, st);
  drv.enqueue_program(0, A.id(), cp, {});
  eA.record(A);
  eA.wait(B);
  Tensor c;
  {
    StreamGuard g(B);
    c = clone(b);
  }
  eB.record(B);
  eB.synchronize();
  CHECK(eA.query());
  A.synchronize();
  CHECK(st->done);
  CHECK(st->cycles > 1e5);
  CHECK(e0.elapsed_ms(eA) >= st->seconds * 1e3 * 0.999);
  CHECK(eA.elapsed_ms(eB) > 0.0);
  CHECK(c.to_vector<float>() == v);
  // Errors of asynchronous work come back through last_error.
  const auto bad = drv.load_program(0, "dma dst=hbm[1125899906842624] src=hbm[0] shape=[1,1,512] q=0 sem=0\nwait sem=0\n");
  const char* env_sync = std::getenv("TPU_SYNC");
  if (!env_sync || std::string(env_sync) == "0") {
    drv.enqueue_program(0, A.id(), bad, {});
    CHECK_THROWS_WITH(A.synchronize(), Contains("tpu:0") && Contains("tpusim") && Contains("asynchronous"));
  } else {  // the plugin runs synchronously too: the error comes at the op
    CHECK_THROWS_WITH(drv.enqueue_program(0, A.id(), bad, {}), Contains("tpu:0") && Contains("program_run"));
  }
  CHECK_THROWS_WITH(drv.load_program(0, "not an instruction"), Contains("tpu:0") && Contains("program_load"));
  for (auto pr : {cp, lp, bad}) drv.unload_program(0, pr);
  CHECK(ones({4}, t).sum().item().to_double() == 4.0);
  set_synchronous_mode(sync);
}

// The plugin sits next to libtpucore. A bare name is not enough for dlopen under ASan (its
// interceptor becomes the caller, so the test's run path is not searched): use the full path.
static std::string sim_plugin_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(static_cast<void (*)(tpu::Device)>(&tpu::synchronize)), &info) && info.dli_fname) {
    std::string p = info.dli_fname;
    auto slash = p.rfind('/');
    if (slash != std::string::npos) return p.substr(0, slash + 1) + kSimPlugin;
  }
  return kSimPlugin;
}

TEST_CASE("plugin: the C ABI directly (struct sizes, statuses, last_error)", "[device]") {
  void* h = dlopen(sim_plugin_path().c_str(), RTLD_NOW | RTLD_LOCAL);
  INFO("dlopen: " << (h ? "ok" : dlerror()));
  REQUIRE(h != nullptr);
  auto get = reinterpret_cast<TpuPluginGetApiFn>(dlsym(h, TPU_PLUGIN_ENTRY_POINT));
  REQUIRE(get != nullptr);
  const TpuPluginApi* api = get();
  REQUIRE(api->abi_version == TPU_PLUGIN_ABI_VERSION);
  CHECK(api->struct_size >= TPU_STRUCT_SIZE(TpuPluginApi, synchronize));
  CHECK(std::string(api->plugin_name) == "tpusim");
  TpuDeviceCountArgs dc{};
  dc.struct_size = sizeof dc;
  REQUIRE(api->device_count(&dc) == TPU_STATUS_OK);
  CHECK(dc.count >= 1);
  // A caller whose struct is too small for the fields a function needs is refused, not misread.
  TpuMemoryArgs m{};
  m.struct_size = offsetof(TpuMemoryArgs, bytes);
  CHECK(api->memory_alloc(&m) == TPU_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(std::string(api->last_error()), Contains("struct_size"));
  m.struct_size = sizeof m;
  m.device = dc.count;  // out of range
  m.bytes = 64;
  CHECK(api->memory_alloc(&m) == TPU_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(std::string(api->last_error()), Contains("device " + std::to_string(dc.count)));
  m.device = 0;
  m.bytes = uint64_t(1) << 50;
  CHECK(api->memory_alloc(&m) == TPU_STATUS_OUT_OF_MEMORY);
  CHECK_THAT(std::string(api->last_error()), Contains("out of device memory"));
  // Alloc, copy in, copy out, free.
  m.bytes = 16;
  REQUIRE(api->memory_alloc(&m) == TPU_STATUS_OK);
  CHECK(m.address != 0);
  const char in[16] = "through the ABI";
  char out[16] = {};
  TpuCopyArgs c{};
  c.struct_size = sizeof c;
  c.kind = TPU_COPY_HOST_TO_DEVICE;
  c.dst_address = m.address;
  c.host_src = in;
  c.bytes = 16;
  REQUIRE(api->copy(&c) == TPU_STATUS_OK);
  c.kind = TPU_COPY_DEVICE_TO_HOST;
  c.src_address = m.address;
  c.host_dst = out;
  REQUIRE(api->copy(&c) == TPU_STATUS_OK);
  CHECK(std::string(out) == in);
  REQUIRE(api->memory_free(&m) == TPU_STATUS_OK);
  // An event never recorded: waiting is a no-op, query says done, time is NaN.
  TpuEventArgs e{};
  e.struct_size = sizeof e;
  REQUIRE(api->event_create(&e) == TPU_STATUS_OK);
  REQUIRE(api->event_query(&e) == TPU_STATUS_OK);
  CHECK(e.done == 1);
  REQUIRE(api->event_time(&e) == TPU_STATUS_OK);
  CHECK(std::isnan(e.time_seconds));
  REQUIRE(api->event_destroy(&e) == TPU_STATUS_OK);
  CHECK(api->event_query(&e) == TPU_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("plugin: a plugin built for another ABI version is refused", "[device]") {
  CHECK_THROWS_WITH(load_driver_plugin("libtpu_bad_abi_plugin.so", DeviceType::tpu),
                    Contains("ABI version 43") && Contains("version 2") && Contains("rebuild"));
}

TEST_CASE("plugin: a path that is not a plugin is a clear error", "[device]") {
  CHECK_THROWS_WITH(load_driver_plugin("libm.so.6", DeviceType::tpu),
                    Contains("not a tpucore driver plugin") && Contains("tpu_plugin_get_api"));
  CHECK_THROWS_WITH(load_driver_plugin("/nonexistent/libnothing.so", DeviceType::tpu),
                    Contains("cannot load") && Contains("/nonexistent/libnothing.so"));
  const std::string txt = fmt::format("/tmp/tpucore_not_a_plugin_{}.so", getpid());
  std::ofstream(txt) << "this is not a shared library\n";
  CHECK_THROWS_WITH(load_driver_plugin(txt, DeviceType::tpu), Contains("cannot load") && Contains("TPU_DRIVER_PATH"));
  std::remove(txt.c_str());
  CHECK_THROWS_WITH(load_driver_plugin(kSimPlugin, DeviceType::cpu), Contains("cpu"));
}

TEST_CASE("plugin: tpu:0 without a driver, and TPU_DRIVER_PATH", "[device]") {
  // In this process: after an explicit load is undone, tpu:0 is the missing-driver error again.
  ensure_plugin();
  CHECK(ones({2}, Device("tpu:0")).sum().item().to_double() == 2.0);
  Tensor survivor = ones({3}, Device("tpu:0"));
  REQUIRE(device::unload_driver_plugin(DeviceType::tpu));
  if (std::getenv("TPU_DRIVER_PATH") == nullptr) {
    CHECK(device_count(DeviceType::tpu) == 0);
    CHECK_THROWS_WITH(zeros({2}, Device("tpu:0")), Contains("TPU_DRIVER_PATH"));
  }
  survivor = Tensor();  // freeing a tensor of the unloaded driver is fine
  // In fresh processes: no driver at all, a bad TPU_DRIVER_PATH, a good one.
  CHECK(run_child("missing", "") == 0);
  CHECK(run_child("bad-path", "/nonexistent/libtpu_driver.so") == 0);
  CHECK(run_child("env-plugin", kSimPlugin) == 0);
}

TEST_CASE("plugin child process (run by the test above)", "[.device-child]") {
  const char* c = std::getenv("TPU_CHILD_CASE");
  const std::string what = c ? c : "";
  if (what == "missing") {
    CHECK_FALSE(device::driver_present(DeviceType::tpu));
    CHECK(device_count(DeviceType::tpu) == 0);
    CHECK_THROWS_WITH(zeros({2}, Device("tpu:0")), Contains("tpu") && Contains("TPU_DRIVER_PATH"));
    CHECK_THROWS_WITH(ones({2}).to("tpu:0"), Contains("TPU_DRIVER_PATH"));
  } else if (what == "bad-path") {
    CHECK_THROWS_WITH(zeros({2}, Device("tpu:0")), Contains("cannot load") && Contains("/nonexistent/libtpu_driver.so") &&
                                                       Contains("TPU_DRIVER_PATH"));
  } else if (what == "env-plugin") {
    Tensor x = arange(6, TensorOptions(DType::f32, Device("tpu:1")));
    CHECK(x.sum().item().to_double() == 15.0);
    CHECK_THAT(device_properties(Device("tpu:0")).name, Contains("tpusim"));
  }
}
