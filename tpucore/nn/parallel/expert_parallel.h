// Expert parallelism of sparse mixture-of-experts blocks (nn::SparseMoE), as TorchTitan's
// ExpertParallel: the E experts of a block are split over a process group of n ranks (rank r
// keeps experts [r E/n, (r + 1) E/n), E must divide by n), the router and everything else stay
// whole. The ranks of the group are data-parallel: each routes its own tokens, sends every
// routed slot to the rank owning its expert (all_to_all_single with uneven splits, after an
// exchange of the per-expert counts), runs its local experts as one grouped_matmul over the
// slots it received from every rank, and sends the results back (the reverse all_to_all); the
// weighted combine then runs locally. Differentiable: the backward of each all-to-all is the
// reverse all-to-all.
//
//   auto mesh = dist::DeviceMesh({2, 2}, {"dp", "ep"});
//   nn::parallel::expert_parallel(*lm, mesh.group("ep"));     // every SparseMoE below lm
//   for (auto& l : lm->model->layers) nn::parallel::fully_shard(l, mesh, {.mesh_axis = "dp"});
//   auto root = nn::parallel::fully_shard(lm, mesh, {.mesh_axis = "dp"});
//   loss.backward();
//   nn::parallel::sync_replicated_gradients(*lm, mesh.group("ep"));  // before the optimizer step
//
// Gradients: the expert weights' gradients are those of the mean of the group's losses (each
// rank's local experts see the slots of every rank); the other parameters are replicated over
// the group and sync_replicated_gradients averages their gradients over it (with fully_shard on
// the other mesh axis: their shards', which the ranks of the ep group hold alike). Composes with
// fully_shard on another mesh axis (a 2-D mesh: EP x FSDP; with tensor parallelism on a third axis, a 3-D mesh), whose units may contain the blocks,
// and with parallelize_module's causal_lm_plan over another axis (EP x TP: attention and dense
// MLPs split over "tp", the experts replicated over it, or split inside by expert_tensor_parallel). Runs on gloo ranks and on the sim pod
// backend (the counts travel as i32, the regrouping on the slots' device). Capacity-factor
// routing of the block (MoEConfig::capacity_factor) is applied by each rank to its own tokens
// before the dispatch.
//
// Two exchanges. Eagerly (the default), the per-expert counts are read on the host and the
// all-to-alls carry exactly the routed slots (uneven splits). Inside tpu::compile (or with
// ExpertParallelOptions::fixed_capacity), shapes are static: every rank sends each peer a buffer
// of C rows (its slots for the peer's experts, then zero padding) and the per-expert counts as an
// i32 tensor (all-to-alls with equal splits); the receiver sorts the rows by local expert on the
// device (moe_sort, the padding in the last expert's group), runs one grouped_matmul with group
// sizes from those counts, and the reverse all-to-all brings the outputs back. Padding rows are
// zeros, their outputs are never read and add nothing to the weight gradients. By default C is
// the dropless worst case (all S slots of the rank; the receiver then computes n S rows), so no
// slot is dropped and the results equal the eager exchange's; a new routing changes no shape,
// so it never recompiles.
#pragma once

#include <cstdint>
#include <vector>

#include "tpucore/dist.h"
#include "tpucore/nn/moe.h"
#include "tpucore/nn/module.h"

namespace tpu::nn::parallel {

/// Options of expert_parallel.
struct ExpertParallelOptions {
  /// Use the fixed-capacity exchange (static shapes, above) eagerly too; inside tpu::compile it
  /// is always used.
  bool fixed_capacity = false;
  /// 0 (the default): dropless, C = S rows per peer (S: this rank's routed slots). A positive
  /// value (implies fixed_capacity): C = min(S, ceil(capacity_factor * S / n)) rows per peer (1.0:
  /// a peer's share under perfectly balanced routing). Slots past the first C a rank routes to
  /// one peer (in expert order, then token order) are dropped: their expert output is zero (the
  /// token keeps its other experts' terms and the residual); expert_parallel_dropped counts them.
  double capacity_factor = 0;
};

/// Shards `moe`'s experts over `group` (also parallelize_module's ExpertParallel style) (this rank must be a member; num_experts must divide by
/// its size, else a tpu::Error) and routes its forward through the group as described above.
/// The block's experts.gate_up_proj / experts.down_proj become this rank's experts (new leaf
/// tensors: create optimizers afterwards). Applying it twice is a tpu::Error.
void expert_parallel(SparseMoE& moe, const dist::ProcessGroupPtr& group, const ExpertParallelOptions& opts = {});
/// expert_parallel on every SparseMoE below `root` (and root itself); returns how many. A root
/// without sparse blocks is a tpu::Error.
int expert_parallel(Module& root, const dist::ProcessGroupPtr& group, const ExpertParallelOptions& opts = {});

/// The slots this rank dropped in the last forward of an expert-parallel block (an i32 scalar
/// tensor on the block's device; inside a compiled function, a value of its graph); undefined
/// after an eager forward of the uneven (dropless) exchange. A block that is not expert-parallel
/// is a tpu::Error.
Tensor expert_parallel_dropped(const SparseMoE& moe);

/// Tensor parallelism inside the experts of `moe` over `group` (the tp axis; this rank must be a
/// member): each expert's intermediate dimension F is split in n blocks (gate and up rows
/// [r F/n, (r + 1) F/n) of gate_up_proj, the same columns of down_proj; F must divide by n, else a
/// tpu::Error); the experts' input is replicated over the group (its gradient summed), their
/// partial outputs are summed. Composes with expert_parallel over another group (in either
/// order): the experts of an ep rank are then split over its tp group. Applying it twice is a
/// tpu::Error. The experts' weights become new leaves: create optimizers afterwards.
void expert_tensor_parallel(SparseMoE& moe, const dist::ProcessGroupPtr& group);

/// Averages over `group` the gradients of root's parameters that expert_parallel did not shard
/// (one all-reduce; a parameter without a gradient counts as zeros and gets the average). Call it on every rank of the group after backward (after fully_shard's
/// reduce-scatters: backward() has waited for them), before the optimizer step.
void sync_replicated_gradients(Module& root, const dist::ProcessGroupPtr& group);

/// The load-balancing loss of nn::load_balancing_loss over the whole batch of `group` (the
/// ranks holding distinct tokens: the data- and expert-parallel ranks together): the chosen-slot
/// counts per expert and the router probability sums are summed over the group (one all-reduce
/// each) before the means are taken, so every rank gets the loss of the one-process batch. Its
/// gradient in the logits is this rank's share, summed over the group (the probability sums'
/// all-reduce has an all-reduce as its backward), so averaging the ranks' gradients (FSDP,
/// sync_replicated_gradients) gives the one-process gradient. A collective: every rank calls it,
/// and runs its backward. Eagerly and inside tpu::compile (the all-reduces become graph nodes).
Tensor load_balancing_loss(const std::vector<Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                           const dist::ProcessGroupPtr& group);
/// The same over the router logits of the last forward of every SparseMoE below `root` (and
/// root itself); no sparse blocks, or blocks of different expert counts or top-k: a tpu::Error.
Tensor load_balancing_loss(Module& root, const dist::ProcessGroupPtr& group);

/// Differentiable all_to_all_single over `group` with split sizes in rows of dim 0: in_splits[j]
/// rows of x go to rank j, out_splits[i] rows come from rank i (the result has sum(out_splits)
/// rows). Its backward is the reverse exchange of the gradient.
Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits,
                       const dist::ProcessGroupPtr& group);

}  // namespace tpu::nn::parallel
