// StridedCopy: the program that gathers a strided view (any strides >= 0, broadcast dims
// included) into a contiguous buffer, HBM to HBM by DMA: the two innermost dims of the view
// (three when the last one is contiguous) in one DMA, up to two more dims as loops.
//
// Arguments: r0 the source's HBM address (first element), r1 the destination's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/config.h"
#include "sim/program.h"

namespace tpu::codegen {

struct StridedView {
  std::vector<int64_t> shape, strides;  // strides in elements
  int64_t elem_size = 4;
};

// Merged dims (size-1 dims dropped, adjacent dims that walk memory contiguously merged).
StridedView collapse_view(const StridedView& v);

// nullopt when the view needs more loops than the generator supports.
std::optional<sim::Program> make_strided_copy(const sim::ChipConfig& cfg, const StridedView& v);
std::string strided_copy_key(const StridedView& v);

}  // namespace tpu::codegen
