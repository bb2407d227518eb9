// Runs the OpInfo table on every device and checks that the table covers the registry.
#include <set>

#include "ops/registry.h"
#include "codegen_testing.h"
#include "opinfo.h"
#include "tpucore/devices.h"
#include "tpucore/kernel.h"

namespace tpu::testing {

std::vector<OpInfo>& opinfo_table() {
  static std::vector<OpInfo> t;
  return t;
}
std::vector<std::pair<std::string, std::string>>& opinfo_covered_elsewhere() {
  static std::vector<std::pair<std::string, std::string>> t;
  return t;
}

// The devices every op is tested on: the host, the in-tree simulator (sim:0 on the default
// v5e-like chip, sim:1 on the tiny chip, whose small VMEM makes the generated kernels tile), and
// the simulator built as a driver plugin and loaded as `tpu` (the ABI path). On sim, ops with a
// lowering run as generated chip programs; the others run through the host fallback.
static std::vector<Device> devices_under_test() {
  load_driver_plugin("libtpusim_plugin.so", DeviceType::tpu);  // unloaded again after the test case
  return {Device("cpu"), Device("sim:0"), Device("sim:1"), Device("tpu:0")};
}

void run_opinfo_entry(const OpInfo& info, Device dev) {
  for (DType dt : info.dtypes) {
    Generator g(1234 + static_cast<uint64_t>(dt));
    for (const OpSample& s : info.samples(dt, g)) {
      std::vector<Tensor> ins;
      std::vector<Ref> refs;
      for (const Tensor& t : s.inputs) {
        refs.push_back(ref_of(t));
        ins.push_back(t.defined() ? t.to(dev) : t);
      }
      std::string what = fmt::format("op {} on {} dtype {} sample '{}'", info.op, dev.str(), dtype_name(dt), s.desc);
      Tensor got;
      try {
        got = info.run(ins);
      } catch (const std::exception& e) {
        FAIL(what << ": threw " << e.what());
      }
      REQUIRE(got.device() == dev);
      check_close(got, info.reference(refs, dt), info.tol(dt), what);
    }
  }
}

TEST_CASE("opinfo: every op matches its naive reference on every device", "[opinfo]") {
  REQUIRE(!opinfo_table().empty());
  TinySim tiny;  // sim:1 on the tiny chip
  for (Device dev : devices_under_test())
    for (const OpInfo& info : opinfo_table()) {
      DYNAMIC_SECTION(info.op << " on " << dev.str()) { run_opinfo_entry(info, dev); }
    }
}

TEST_CASE("opinfo: every registered op has an entry", "[opinfo]") {
  std::set<std::string> covered;
  for (const OpInfo& i : opinfo_table()) covered.insert(i.op);
  for (const auto& [op, why] : opinfo_covered_elsewhere()) covered.insert(op);
  std::vector<std::string> missing;
  for (const ops::OpDef* d : ops::all_ops())  // ops made by kernel::register_op are the user's
    if (!covered.count(d->name) && !kernel::is_kernel_op(d->name)) missing.push_back(d->name);
  INFO("registered ops without an OpInfo entry: " << fmt::format("{}", fmt::join(missing, ", ")));
  CHECK(missing.empty());
}

TEST_CASE("opinfo: every kernel, lowering and backward registration found its op", "[opinfo]") {
  // Registrations for names no op has (a misspelt or removed op) stay pending in the registry.
  const std::vector<std::string> left = ops::undefined_registrations();
  INFO("registrations for undefined ops: " << fmt::format("{}", fmt::join(left, ", ")));
  CHECK(left.empty());
  // The lowerings codegen installs reached their ops whatever the static initialization order.
  for (const char* op : {"linear", "matmul", "sum", "mean", "amax"}) {
    INFO(op);
    const ops::OpDef* d = ops::find_op(op);
    REQUIRE(d);
    CHECK(d->lowering != nullptr);
  }
}

}  // namespace tpu::testing
