// Fully sharded data parallelism (ZeRO-3, in the style of PyTorch's FSDP2 `fully_shard`).
//
//   auto mesh = tpu::dist::DeviceMesh({world}, {"dp"});
//   for (auto& layer : lm->model->layers) nn::parallel::fully_shard(layer, mesh);  // units
//   auto root = nn::parallel::fully_shard(lm, mesh);             // the rest (embedding, head)
//   tpu::optim::AdamW opt(root->parameters(), {});               // shards only
//   loss = cross_entropy((*lm)(ids), targets); loss.backward(); opt.step();
//
// Every parameter of a unit is split along dim 0 over the mesh axis: rank r keeps rows
// [r c, (r + 1) c) of each (c = ceil(rows / ranks); the last ranks may hold fewer or none) as a
// leaf tensor that replaces the parameter in the module, so parameters(), optimizers and
// zero_grad see shards only. A unit's forward all-gathers its parameters (one collective for the
// unit, into full tensors the layer code reads through its usual members), runs, and frees them
// again; while it runs, the next unit's gather (in the order of the previous iteration) is
// already in flight. In backward the unit's parameters are gathered again just before the
// unit's gradients are computed (the unit before it is prefetched), and once every gradient of
// the unit is known they are reduce-scattered (averaged over the ranks, asynchronously) into the
// shards' .grad; the full parameters are freed. When the last unit's gradients are scattered,
// backward() returns with every shard's .grad set (accumulated when already set).
//
// fully_shard installs forward hooks on the module (nn::Module::register_forward_pre_hook): a
// unit runs sharded whenever its module is called through its hooks (operator()(x),
// Module::call, which models::DecoderLayer::forward uses), so a model is called as it is, or
// through the handle fully_shard returns (forward(x), or run(f) around a forward that calls no
// hooks itself). Calling a module's forward() directly skips the hooks: store the handle where
// the parent calls such a layer that way (a vector of shared_ptr<Module>). Inside tpu::compile the gathers and reduce-scatters
// become graph nodes: a whole training step (zero_grad, forward, backward, optimizer step) is one
// graph; the gathered parameters are then graph values kept from the forward to their last
// backward reader (no release and regather), and the graph's scheduler does the prefetching.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tpucore/dist.h"
#include "tpucore/nn/module.h"

namespace tpu::optim {
class Optimizer;
}

namespace tpu::nn::parallel {

// bf16 compute on f32 master shards: parameters are cast before the all-gather (half the bytes),
// gradients are reduce-scattered in reduce_dtype and land in the f32 shards' .grad.
struct MixedPrecision {
  DType param_dtype = DType::bf16;
  DType reduce_dtype = DType::f32;
  bool cast_forward_inputs = true;  // floating inputs of forward(x) are cast to param_dtype
};

struct FSDPOptions {
  std::string mesh_axis;                          // "" : the mesh's only axis
  std::optional<MixedPrecision> mixed_precision;  // none: compute in the parameters' dtype
  bool reshard_after_forward = true;              // false: keep gathered until backward (not for the root: never)
  bool prefetch = true;                           // gather the next unit while this one computes
  bool sync_module_states = false;                // broadcast rank 0's parameters before sharding
};

namespace detail { struct Unit; }

class FSDPModule : public Module {
 public:
  FSDPModule(std::shared_ptr<Module> module, std::shared_ptr<detail::Unit> unit);
  ~FSDPModule() override;
  Tensor forward(const Tensor& x) override;
  // A forward of another signature: f calls the wrapped module while its parameters are gathered.
  Tensor run(const std::function<Tensor()>& f);
  std::string type_name() const override;
  Module& module() const;
  const dist::ProcessGroupPtr& group() const;

  // Waits for outstanding reduce-scatters and writes the shards' gradients (backward does it
  // itself once every unit's gradients are known; call this when some unit got no backward).
  void wait_gradients();
  // Global L2 norm of the shards' gradients over the group (every rank gets the same), scaled
  // so that it is at most max_norm; returns the norm before clipping. Collective.
  double clip_grad_norm_(double max_norm);

  // Bytes of gathered (full) parameters alive right now under this root, and of its shards on
  // this rank: after a forward only the root's own parameters stay gathered (for backward);
  // after backward none.
  struct MemoryStats {
    int64_t gathered_bytes = 0, shard_bytes = 0;
  };
  MemoryStats memory_stats() const;

  // ---- checkpoints (on the root handle; collective over the group) ----
  // Full tensors by dotted name (parameters of every unit below), on every rank.
  StateDict full_state_dict();
  // Each rank takes its rows of every parameter from full tensors (shapes must match).
  void load_full_state_dict(const StateDict& sd);
  // Each rank writes dir/shard-RRRRR-of-WWWWW.safetensors (its rows of every parameter, with
  // their global shapes and row ranges in the metadata), and with `opt` (an optimizer over the
  // shards) its per-parameter state (AdamW's moments, SGD's momentum) sharded the same way.
  void save_sharded(const std::string& dir, const optim::Optimizer* opt = nullptr);
  // Reads a checkpoint saved on any number of ranks (resharding to this group's size), or a
  // consolidated file: `path` is a directory of shard files or one .safetensors file. Missing,
  // foreign or inconsistent files are a tpu::Error naming the file and tensor. With `opt`, the
  // optimizer state saved with the shards is resharded into it too.
  void load(const std::string& path, optim::Optimizer* opt = nullptr);
  // One safetensors file with the full tensors under their module names (rank 0 writes it; a
  // non-sharded model loads it with load_state_dict).
  void save_full(const std::string& path);

  detail::Unit& unit() const { return *unit_; }

 private:
  std::shared_ptr<Module> module_;
  std::shared_ptr<detail::Unit> unit_;
};

// Shards `module`'s parameters (those not already in a unit below it) over the mesh axis and
// returns its handle. Call it on the blocks first, then on the root.
std::shared_ptr<FSDPModule> fully_shard(std::shared_ptr<Module> module, const dist::DeviceMesh& mesh,
                                        const FSDPOptions& options = {});
std::shared_ptr<FSDPModule> fully_shard(std::shared_ptr<Module> module, dist::ProcessGroupPtr group,
                                        const FSDPOptions& options = {});

}  // namespace tpu::nn::parallel
