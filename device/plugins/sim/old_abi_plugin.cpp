// A plugin of the previous ABI (version 1: programs without arguments) for the loader's tests:
// its table is the version-1 layout, and tpucore must refuse it with an error that asks for a
// rebuild rather than run generated programs that would never see their operands.
#include "device/plugin_abi.h"

namespace {
const char* last_error() { return ""; }
TpuStatus device_count(TpuDeviceCountArgs* a) {
  a->count = 1;
  return TPU_STATUS_OK;
}
// Two entry points are enough for the loader to reach its version check; the rest stay null.
TpuPluginApi make_api() {
  TpuPluginApi a{};
  a.struct_size = TPU_STRUCT_SIZE(TpuPluginApi, synchronize);  // the version-1 table ended there
  a.abi_version = 1;
  a.plugin_name = "old-abi-test-plugin";
  a.last_error = &last_error;
  a.device_count = &device_count;
  return a;
}
const TpuPluginApi kApi = make_api();
}  // namespace

extern "C" TPU_PLUGIN_EXPORT const TpuPluginApi* tpu_plugin_get_api(void) { return &kApi; }
