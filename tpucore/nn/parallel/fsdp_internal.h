// Internal state of fully_shard (fsdp.cpp: units, forward and backward hooks;
// fsdp_checkpoint.cpp: full and sharded checkpoints).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tpucore/nn/parallel/fsdp.h"

namespace tpu::nn::parallel::detail {

// One parameter of a unit: rank r keeps rows [r chunk, r chunk + local_rows) of the parameter
// seen as [rows, row_numel]; in the per-rank packed buffer its rows start at `offset` (padded to
// chunk rows, so every rank's buffer has the same size).
struct ShardedParam {
  std::string name;  // dotted, relative to the root module (relative to the unit's until claimed)
  Tensor* slot = nullptr;
  Tensor shard;      // the master copy of the local rows (a leaf that requires grad)
  Shape full_shape;
  int64_t rows = 1, row_numel = 1, chunk = 1, first_row = 0, local_rows = 0, offset = 0;
  int64_t rows_of(int r) const { return std::max<int64_t>(0, std::min(chunk, rows - r * chunk)); }
};

struct RootState;
struct Instance;

// Whether a forward of the unit is running (its parameters are in the module's slots); a hook
// entered again while it runs (a handle's run() around a module that calls its own hooks) nests.
enum class TrainingState { idle, forward };
// Whether an all-gather of the unit's shards is in flight (started ahead of use by a prefetch).
enum class GatherState { none, in_flight };

struct Unit : std::enable_shared_from_this<Unit> {
  // The wrapped module: its forward hooks own this unit (so not a shared_ptr: no cycle).
  Module* module = nullptr;
  dist::ProcessGroupPtr pg;
  int rank = 0, world = 1;
  FSDPOptions opts;
  std::vector<ShardedParam> params;
  int64_t flat = 0;  // elements of one rank's packed buffer
  DType master_dtype = DType::f32, compute_dtype = DType::f32, reduce_dtype = DType::f32;
  Device device;
  bool is_root = true;
  std::shared_ptr<RootState> root;
  GatherState gather = GatherState::none;
  dist::Work gather_work;
  Tensor gather_in, gather_out;
  TrainingState state = TrainingState::idle;
  int nested = 0;                    // hook entries nested inside the running forward
  std::shared_ptr<Instance> current;  // the running forward
  std::vector<Tensor> current_full;   // its full parameters (in the module's slots)

  Tensor pack_shards(DType dtype) const;  // [flat]
  void start_gather();                    // in compute_dtype; no-op when one is in flight
  Tensor finish_gather();                 // [world * flat], starting a gather if none is in flight
  void drop_gather();                     // waits for and discards a gather in flight
  // Copies every rank's rows of each parameter out of a gathered buffer into full tensors.
  void fill(const Tensor& gathered, const std::vector<Tensor>& full) const;
  // Synchronous full tensors in `dtype` (checkpoints).
  std::vector<Tensor> gather_full(DType dtype);
  // Around a forward of the module (its hooks, or a handle's run()): gathers the parameters into
  // the module's slots; after it, puts the shards back and arms the backward hooks. y undefined:
  // the forward failed (the shards go back, nothing is armed).
  void pre_forward();
  void post_forward(Tensor& y);
  Tensor call(const std::function<Tensor()>& f);
};

struct PendingReduce {
  std::shared_ptr<Unit> unit;
  dist::Work work;
  Tensor in, out;
};

struct RootState {
  std::vector<std::weak_ptr<Unit>> units;  // the root first, then the units below it
  std::vector<std::weak_ptr<Instance>> now;  // this iteration's forwards, in order
  std::vector<std::weak_ptr<Unit>> order;    // the units of the last complete forward, in order
  std::vector<PendingReduce> pending;
  int outstanding = 0;  // forwards with history whose gradients have not been scattered yet
  void finalize();      // waits for the scatters, writes the shards' .grad, drops stale gathers
  std::vector<std::shared_ptr<Unit>> live_units() const;
};

}  // namespace tpu::nn::parallel::detail
