// A deliberately incompatible plugin for the loader's tests: it reports an ABI version this
// tpucore does not implement, so loading it must be refused with a clear error.
#include "device/plugin_abi.h"

namespace {
const TpuPluginApi kApi = {
    .struct_size = sizeof(TpuPluginApi),
    .abi_version = TPU_PLUGIN_ABI_VERSION + 41,
    .plugin_name = "bad-abi-test-plugin",
};
}  // namespace

extern "C" TPU_PLUGIN_EXPORT const TpuPluginApi* tpu_plugin_get_api(void) { return &kApi; }
