// Fuzzes the graph JSON reader (tpu::graph::from_json). An accepted graph must write and read
// back to the same JSON.
#include "graph/printer.h"
#include "tpucore/core/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpu::graph::Graph g;
  try {
    g = tpu::graph::from_json(tpu_fuzz::text_of(data, size));
  } catch (const tpu::Error&) {
    return 0;
  }
  const std::string text = tpu::graph::to_json(g);
  std::string again;
  try {
    again = tpu::graph::to_json(tpu::graph::from_json(text));
  } catch (const tpu::Error& e) {
    tpu_fuzz::finding(std::string("a written graph does not read back: ") + e.what(), text);
  }
  if (again != text) tpu_fuzz::finding("write/read round trip changed the graph", text + "\n---\n" + again);
  return 0;
}
