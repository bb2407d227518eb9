// A test library exporting GetPjrtApi with PJRT C API version 0.20 (older than the 0.33 the
// client needs): loading it must be refused with a tpu::Error naming both versions. Its table
// holds no functions; the client must not call any of them.
#include <cstring>

#include "device/pjrt/pjrt_c_api.h"

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  static PJRT_Api api = [] {
    PJRT_Api a;
    std::memset(static_cast<void*>(&a), 0, sizeof a);
    a.struct_size = sizeof a;
    a.pjrt_api_version.struct_size = sizeof a.pjrt_api_version;
    a.pjrt_api_version.major_version = 0;
    a.pjrt_api_version.minor_version = 20;
    return a;
  }();
  return &api;
}
