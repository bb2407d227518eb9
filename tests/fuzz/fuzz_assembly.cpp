// Fuzzes the simulator's text assembler (sim::parse_program). Accepted programs must print and
// parse back to the same text (the round trip sim/assembly.h promises).
#include "sim/assembly.h"
#include "sim/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpu::sim::Program p;
  try {
    p = tpu::sim::parse_program(tpu_fuzz::text_of(data, size), "fuzz");
  } catch (const tpu::sim::SimError&) {
    return 0;  // rejected with the simulator's error: fine
  }
  const std::string text = tpu::sim::to_text(p);
  std::string again;
  try {
    again = tpu::sim::to_text(tpu::sim::parse_program(text, "fuzz"));
  } catch (const tpu::sim::SimError& e) {
    tpu_fuzz::finding(std::string("a printed program does not parse: ") + e.what(), text);
  }
  if (again != text) tpu_fuzz::finding("print/parse round trip changed the program", text + "\n---\n" + again);
  return 0;
}
