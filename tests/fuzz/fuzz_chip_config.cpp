// Fuzzes the chip config JSON reader (sim::config_from_json_text). An accepted config must
// validate, and write and read back to the same JSON.
#include <nlohmann/json.hpp>

#include "sim/config.h"
#include "sim/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpu::sim::ChipConfig c;
  try {
    c = tpu::sim::config_from_json_text(tpu_fuzz::text_of(data, size));
    c.validate();
  } catch (const tpu::sim::SimError&) {
    return 0;
  }
  const std::string text = tpu::sim::config_to_json(c).dump();
  std::string again;
  try {
    again = tpu::sim::config_to_json(tpu::sim::config_from_json_text(text)).dump();
  } catch (const tpu::sim::SimError& e) {
    tpu_fuzz::finding(std::string("a written config does not read back: ") + e.what(), text);
  }
  if (again != text) tpu_fuzz::finding("write/read round trip changed the config", text + "\n---\n" + again);
  return 0;
}
