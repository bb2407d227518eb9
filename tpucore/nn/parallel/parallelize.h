// Tensor parallelism applied to an existing model by module name (as TorchTitan's
// parallelize_module): a plan maps module names (dotted, '*' matching one name component) to a
// style; each matched module keeps its type and code, its parameters are replaced by this rank's
// block, and forward hooks (nn::Module::register_forward_pre_hook) insert the collectives.
//
//   auto tp = mesh.group("tp");
//   nn::parallel::parallelize_module(*lm, tp, nn::parallel::causal_lm_plan(*lm, /*sequence=*/true));
//   Tensor logits = (*lm)(ids);   // replicated over the group, as the one-process model's
//
// Styles (n = the group's size; layouts name how an activation is spread over the group):
// - colwise (Linear): weight rows (output features) and bias split in n blocks; the input is
//   made replicated (gathered from sequence shards), its gradient summed over the group; the
//   output leaves split along the last dim (or gathered, or as sequence shards).
// - rowwise (Linear): weight columns (input features) split; the input must arrive split along
//   the last dim (a replicated one is sliced); the partial outputs are summed over the group,
//   the bias (replicated) added once; the output leaves replicated or as sequence shards.
//   A nn::QuantizedLinear's scales split with its weight: colwise, per-row and int4 group
//   scales with the rows (fp8 block scales by whole blocks of rows); rowwise, per-row scales
//   whole, int4 group and fp8 block scales along the input features. A split cutting an int4
//   group or an fp8 block is a tpu::Error.
// - replicate (any module, e.g. RMSNorm): parameters stay whole on every rank, their gradients
//   are summed over the group: for modules that see a different part of the activations on each
//   rank (a norm over this rank's heads, or over its sequence shard in sequence parallelism).
// - prepare_input / prepare_output (any module): parameters untouched; the input or output is
//   redistributed (the embedding's output into sequence shards for sequence parallelism, the
//   attention's input gathered from them: attention mixes positions).
// - expert (nn::SparseMoE): expert parallelism (tpucore/nn/parallel/expert_parallel.h).
// - latent_attention (nn::MLAttention, with its q_proj / q_b_proj and kv_b_proj colwise and
//   o_proj rowwise): the latent projections and norms stay whole on every rank and compute the
//   same latent; each rank's heads read the whole rotated key part k_pe, so its gradient is
//   summed over the group (copy_to_tp on that part of kv_a_proj_with_mqa's output; the
//   compressed part's gradient is summed by kv_b_proj's column parallelism). Training runs the
//   expanded form; the absorbed decoding forms (no gradients) read the replicated latent as is.
// Attention over split heads needs no style of its own: nn::Attention takes its local head
// counts from the shapes of its q/k projections. The styles' collectives trace inside
// tpu::compile; tested compiled: causal_lm_plan without sequence parallelism.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tpucore/dist.h"
#include "tpucore/nn/module.h"

namespace tpu::nn::parallel {

/// How an activation is spread over a tensor-parallel group.
enum class Layout {
  replicate,   ///< every rank holds the whole tensor
  shard_last,  ///< rank r holds the r-th of n blocks of the last dim
  shard_seq,   ///< rank r holds the r-th of n blocks of dim 1 (the sequence of [B, T, ...])
};

/// What parallelize_module does to one module (build with the functions below).
struct ParallelStyle {
  /// The kind of the style (see the file comment).
  enum class Kind { colwise, rowwise, replicate, prepare_input, prepare_output, expert, latent_attention };
  /// The kind.
  Kind kind = Kind::replicate;
  /// How the module's input arrives.
  Layout input = Layout::replicate;
  /// How the module's output should leave.
  Layout output = Layout::replicate;
};

/// Column parallelism of a Linear: the input arrives as `input` (replicate or shard_seq), the
/// output leaves as `output` (shard_last: local, replicate: gathered, shard_seq).
ParallelStyle ColwiseParallel(Layout input = Layout::replicate, Layout output = Layout::shard_last);
/// Row parallelism of a Linear: the input arrives as `input` (shard_last or replicate), the
/// output leaves as `output` (replicate or shard_seq).
ParallelStyle RowwiseParallel(Layout input = Layout::shard_last, Layout output = Layout::replicate);
/// Replicated parameters with gradients summed over the group; the input arrives as `input`
/// and the output leaves as `output` (replicate or shard_seq; shard_seq in, replicate out
/// gathers the sequence after the module).
ParallelStyle ReplicateParallel(Layout input = Layout::replicate, Layout output = Layout::replicate);
/// Sequence parallelism of a norm: ReplicateParallel with sequence shards in and out.
ParallelStyle SequenceParallel();
/// Only the output is redistributed, from `from` to `to` (replicate <-> shard_seq).
ParallelStyle PrepareModuleOutput(Layout from, Layout to);
/// Only the (first tensor) input is redistributed, from `from` to `to`.
ParallelStyle PrepareModuleInput(Layout from, Layout to);

/// Expert parallelism of a nn::SparseMoE block over the group (expert_parallel.h): its experts
/// split over the ranks, the routed tokens dispatched and combined by all-to-all.
ParallelStyle ExpertParallel();

/// Tensor parallelism over the heads of a nn::MLAttention (see latent_attention above).
ParallelStyle LatentAttentionParallel();

/// Module name patterns (dotted; '*' matches one component) with their styles.
using ParallelPlan = std::vector<std::pair<std::string, ParallelStyle>>;

/// Applies `plan` to `root`'s submodules over `group` (this rank must be a member). Every
/// pattern must match at least one module; a style's kind must fit the module (colwise and
/// rowwise need a nn::Linear) and split sizes must divide by the group's size, else a tpu::Error
/// naming the module. The matched modules must be called through their hooks (operator(),
/// Module::call). Create optimizers afterwards (the parameters are new tensors).
void parallelize_module(Module& root, const dist::ProcessGroupPtr& group, const ParallelPlan& plan);

/// The Megatron plan of models::CausalLM (Llama / Qwen2 / Qwen3 / Mistral): q/k/v_proj and
/// gate/up_proj colwise, o_proj and down_proj rowwise, q/k norms replicated with summed
/// gradients; lm_head (when not tied) colwise with gathered logits. With `sequence`, the
/// residual stream between the blocks is split along the sequence: norms sequence-parallel,
/// the embedding's output sharded, the final norm's output gathered again.
/// `model` is the CausalLM: its q/k norms, dense MLPs and untied lm_head enter the plan when it
/// has them. A mixture-of-experts model's sparse blocks (nn::SparseMoE) are left whole (replicated
/// over the group; expert_parallel shards their experts over another group, EP x TP); with
/// `sequence`, such a model is a tpu::Error (sparse blocks on sequence shards are not supported).
/// Multi-head latent attention (DeepSeek-V3, nn::MLAttention) is split over its heads instead:
/// q_b_proj (or q_proj) and kv_b_proj colwise, o_proj rowwise, the attention module
/// LatentAttentionParallel; q_a_proj, kv_a_proj_with_mqa and their norms stay whole (the
/// number of heads must divide by the group's size).
ParallelPlan causal_lm_plan(const Module& model, bool sequence = false);

}  // namespace tpu::nn::parallel
