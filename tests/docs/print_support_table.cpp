// Prints the decoder family's support table (tpu::models::support_table_markdown), which the
// CTest "docs: the model support table matches the code" looks for in docs/models-and-tokenizers.md.
#include <cstdio>

#include "tpucore/models.h"

int main() {
  std::fputs(tpu::models::support_table_markdown().c_str(), stdout);
  return 0;
}
