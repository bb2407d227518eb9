// Internal: the assembly/JSON field layout of each instruction format, shared by the text
// assembler and the JSON serializer so both name fields the same way.
#pragma once
#include <vector>

#include "sim/isa.h"

namespace tpu::sim::detail {

enum class FK {
  reg, reg_a, imm, n, sem, q, mxu, dst_addr, src_addr, shape3, dst_stride, src_stride,
  dst, a, b, c, rows, k, cols, mode, acc, shape2, axis, value
};
struct FieldDef {
  const char* key;
  FK kind;
  bool required;
};

const std::vector<FieldDef>& fields_of(Format f);

}  // namespace tpu::sim::detail
