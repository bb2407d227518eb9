// Fuzzes the simulator's program JSON reader (sim::program_from_json_text). Accepted programs
// must serialize and read back to the same JSON.
#include "sim/error.h"
#include "sim/serialize.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpu::sim::Program p;
  try {
    p = tpu::sim::program_from_json_text(tpu_fuzz::text_of(data, size));
  } catch (const tpu::sim::SimError&) {
    return 0;
  }
  const std::string text = tpu::sim::program_to_json_text(p);
  std::string again;
  try {
    again = tpu::sim::program_to_json_text(tpu::sim::program_from_json_text(text));
  } catch (const tpu::sim::SimError& e) {
    tpu_fuzz::finding(std::string("a written program does not read back: ") + e.what(), text);
  }
  if (again != text) tpu_fuzz::finding("write/read round trip changed the program", text + "\n---\n" + again);
  return 0;
}
