// Fuzzes the safetensors reader (tpu::parse_safetensors). An accepted file must serialize and
// read back to the same bytes (the writer's layout is canonical: sorted names, padded header).
#include <span>

#include "tpucore/core/error.h"
#include "tpucore/safetensors.h"
#include "fuzz_common.h"

namespace {
std::vector<uint8_t> write(const tpu::SafetensorsContents& c) {
  tpu::TensorList list(c.tensors.begin(), c.tensors.end());
  return tpu::serialize_safetensors(list, c.metadata);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpu::SafetensorsContents c;
  try {
    c = tpu::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz");
  } catch (const tpu::Error&) {
    return 0;
  }
  std::vector<uint8_t> once, twice;
  try {
    once = write(c);
    twice = write(tpu::parse_safetensors(once, "fuzz (rewritten)"));
  } catch (const tpu::Error& e) {
    tpu_fuzz::finding(std::string("an accepted file does not rewrite and read back: ") + e.what());
  }
  if (once != twice) tpu_fuzz::finding("write/read round trip changed the file");
  return 0;
}
