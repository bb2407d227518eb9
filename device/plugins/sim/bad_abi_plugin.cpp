// A deliberately incompatible plugin for the loader's tests: it reports an ABI version this
// tpucore does not implement, so loading it must be refused with a clear error.
#include "device/plugin_abi.h"

namespace {
// Only the header fields are set; every entry point stays null.
TpuPluginApi make_api() {
  TpuPluginApi a{};
  a.struct_size = sizeof(TpuPluginApi);
  a.abi_version = TPU_PLUGIN_ABI_VERSION + 41;
  a.plugin_name = "bad-abi-test-plugin";
  return a;
}
const TpuPluginApi kApi = make_api();
}  // namespace

extern "C" TPU_PLUGIN_EXPORT const TpuPluginApi* tpu_plugin_get_api(void) { return &kApi; }
