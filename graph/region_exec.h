// The cpu region executor: runs a fused region tile by tile. A tile is a box of the region's
// domain (fixed indices on the leading dims, a range on the split dim, whole trailing dims);
// each node of the region runs its registered cpu kernel on tile views: intermediates live in
// small per-thread scratch buffers (hot in cache), region outputs are written straight into
// their final buffers. Tiles are split over the cores with tpu::parallel_for.
#pragma once

#include <vector>

#include "graph/ir.h"
#include "graph/op_class.h"

namespace tpu::graph {

struct RegionAccess {
  ValueId value = kNoValue;
  InputMode mode = InputMode::broadcast;
};
struct RegionStepProgram {
  int32_t node = -1;
  std::vector<RegionAccess> inputs;
  ValueId output = kNoValue;
  int32_t scratch = -1;  // index into scratch buffers, or -1 (a region output)
};
struct RegionProgram {
  Shape domain;
  int split_dim = 0;        // tiles range over this dim
  int64_t tile_len = 1;     // elements of the split dim per tile
  int64_t tiles_per_row = 1;
  int64_t num_tiles = 0;
  int64_t tile_elems = 0;   // elements of the domain per full tile
  std::vector<RegionStepProgram> steps;
  std::vector<ValueId> scratch_values;
};

RegionProgram prepare_region(const Graph& g, const Region& r, int64_t target_tile_elems = 0);
// vals: per-value tensors; external inputs and the (allocated) region outputs must be set.
void run_region(const Graph& g, const RegionProgram& p, std::vector<Tensor>& vals);

}  // namespace tpu::graph
