// Pod: N simulated chips joined by ICI in a slice (sim/ici.h). Collectives compute real values
// in the chips' HBM and cost what the ICI algorithm costs; each is asynchronous (start, then
// done) so chips run programs meanwhile. Every chip has its own clock (cycles); a collective
// starts when all its chips reached it and the ICI of each is free, and done() moves the clocks
// of its chips to its end. Collectives appear on an "ICI" track of the pod's Chrome trace.
//
//   tpu::sim::Pod pod("v5e", "4x4");                 // 16 v5e chips, ICI of the v5e preset
//   pod.chip(i).write_hbm(addr, host, bytes);        // per chip
//   auto h = pod.start({.kind = CollectiveKind::all_reduce, .dtype = DType::f32, .count = n,
//                       .src = addrs, .dst = addrs});
//   pod.run(0, program);                             // overlaps the all-reduce
//   CollectiveResult r = pod.done(h);                // values written, clocks advanced
//
// Timing-only pods (PodOptions::timing_only) have no chips' memory traffic and cost a 16x16 or
// 16x20x28 slice in microseconds: every group of a collective along the same axes runs the
// same schedule on disjoint links, so one group is simulated and stands for all (symmetry).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sim/chip.h"
#include "sim/ici.h"
#include "sim/types.h"

namespace tpu::sim {

enum class ReduceOp : uint8_t { sum, max, min, prod, avg };
std::string reduce_op_name(ReduceOp op);

// Element types beyond the chip's own (DType) that collectives also carry, for host runtimes
// whose tensors have them: when `elem` is not native it gives the element size and the
// arithmetic of reductions, and `dtype` is ignored. f16 reduces in f32 and rounds once; u8
// wraps; boolean: sum/max/avg are "or", prod/min "and".
enum class ElemType : uint8_t { native, f16, u8, boolean };
int elem_size(DType dtype, ElemType elem);
std::string elem_name(DType dtype, ElemType elem);

// One collective. Addresses are HBM byte addresses, one per chip of the pod in chip order (or
// one per member when `members` is set). Element counts per kind:
//   all_reduce     count in, count out (src may equal dst)
//   all_gather     count in, count x G out, chip r's block at r x count (G = group size)
//   reduce_scatter count in (a multiple of G), count / G out: block r of the reduction
//   all_to_all     count in (a multiple of G), count out: block j of chip r lands as block r of j
//   permute        count: each (source, target) pair copies source's src to target's dst; a
//                  chip that is no target keeps its dst
//   broadcast      count: `root`'s src to every chip's dst (rank of the root within its group)
struct CollectiveSpec {
  CollectiveKind kind = CollectiveKind::all_reduce;
  ReduceOp op = ReduceOp::sum;
  DType dtype = DType::f32;
  uint64_t count = 0;
  std::vector<uint64_t> src, dst;
  std::vector<int> axes;                     // the axes spanned (empty: all); one group per rest
  std::vector<int> members;                  // instead of axes: one group of these chips, in rank order
  std::vector<std::pair<int, int>> pairs;    // permute: (source, target) ranks
  int root = 0;                              // broadcast
  std::string name;                          // trace label (default: the kind)
  ElemType elem = ElemType::native;          // f16 / u8 / boolean instead of dtype
};

struct CollectiveResult {
  double start_cycle = 0, end_cycle = 0;
  double cycles = 0;              // end - start
  double seconds = 0;
  uint64_t bytes = 0;             // the book's V for this collective (ici.h)
  double achieved_gbps = 0;       // bytes / seconds / 1e9
  IciCost cost;
};

struct PodOptions {
  bool timing_only = false;  // collectives move no data (and chips run timing-only programs)
  bool trace = true;         // record collectives (and traced program runs) for chrome_trace()
};

class Pod {
 public:
  // chip: a preset name / JSON path / JSON text; ici: a preset name (default: the chip's name).
  Pod(const std::string& chip, const std::string& shape, PodOptions opt = {}, const std::string& ici = "");
  Pod(const ChipConfig& chip, const IciConfig& ici, const std::vector<int>& shape, PodOptions opt = {});
  // A pod over chips owned elsewhere (the device layer's), one pointer per chip of the slice;
  // null for chips a caller will not touch (collectives among the others still work). They
  // must share one chip config.
  Pod(std::vector<Chip*> chips, const IciConfig& ici, const std::vector<int>& shape, PodOptions opt = {});
  ~Pod();
  Pod(Pod&&) noexcept;
  Pod& operator=(Pod&&) noexcept;

  int size() const;
  const Topology& topology() const;
  Chip& chip(int i);
  double clock(int chip) const;                  // the chip's cycle clock
  void advance(int chip, double cycles);         // the chip computed for `cycles`

  // A program on one chip at its clock; the clock moves by the program's cycles.
  RunResult run(int chip, const Program& prog, RunOptions opt = {});

  // Checks the spec (SimError naming what is wrong), reads the inputs, schedules the ICI and
  // returns a handle. Values reach the outputs at done(), which moves the clocks of the group's
  // chips to the end. A handle is done once.
  uint64_t start(const CollectiveSpec& spec);
  CollectiveResult done(uint64_t handle);
  CollectiveResult collective(const CollectiveSpec& spec) { return done(start(spec)); }

  // The cost of `spec` on this topology without running it (no addresses needed).
  IciCost cost(const CollectiveSpec& spec) const;

  // Chrome trace: one process per chip with a "compute" and an "ICI" track; ICI events carry
  // bytes, achieved GB/s and the algorithm in args.
  std::string chrome_trace() const;
  void write_chrome_trace(const std::string& path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Reference semantics shared by the pod and the device layer: the reduced values of `n`
// elements of `dtype` from `inputs` (one pointer per rank) into `out` (bf16 reduces in f32 and
// rounds once; integers wrap; avg divides the sum by the rank count, truncating integers).
void reduce_buffers(DType dtype, ReduceOp op, const std::vector<const void*>& inputs, void* out, uint64_t n,
                    ElemType elem = ElemType::native);

}  // namespace tpu::sim
