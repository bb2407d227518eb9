// Tensor parallelism (Megatron-LM style) over one process group (a mesh axis, e.g. "tp").
//
// Rank r of a group of size n holds the r-th 1/n of each split parameter: column-parallel
// layers split the output features (each rank computes its slice of the output), row-parallel
// layers split the input features (each rank computes a partial sum, all-reduced). A
// column-parallel layer followed by a row-parallel one (the MLP; q/k/v then o_proj in
// attention, heads split across ranks) needs one all-reduce in forward and one in backward.
// The layers are built from full layers (every rank builds the same full layer from the same
// seed, or loads it) and keep only their slice; the full layers' weights must be float (a
// quantized weight is a tpu::Error: nn::QuantizedLinear splits through parallelize_module).
// Inputs and outputs of the blocks are replicated over the group. The four collectives (copy_to_tp, reduce_from_tp, gather_from_tp,
// scatter_to_tp) and their backwards also trace inside tpu::compile (graph nodes); tested there
// through causal_lm_plan and expert_tensor_parallel (tests/pod: the 3-D EP x TP x FSDP mesh).
#pragma once

#include "tpucore/dist.h"
#include "tpucore/nn/layers.h"
#include "tpucore/nn/transformer.h"

namespace tpu::nn::parallel {

// The conjugate pairs of Megatron-LM ("f" and "g"): identity forward / all-reduce (sum)
// backward, and all-reduce forward / identity backward; gather and scatter along the last dim.
Tensor copy_to_tp(const Tensor& x, const dist::ProcessGroupPtr& group);
Tensor reduce_from_tp(const Tensor& x, const dist::ProcessGroupPtr& group);
Tensor gather_from_tp(const Tensor& x, const dist::ProcessGroupPtr& group);   // [.., k] -> [.., n k]
Tensor scatter_to_tp(const Tensor& x, const dist::ProcessGroupPtr& group);    // [.., n k] -> rank's [.., k]

// y = x W^T + b with W's rows (output features) split: weight [out / n, in], bias [out / n].
class ColumnParallelLinear : public Module {
 public:
  ColumnParallelLinear(const Linear& full, dist::ProcessGroupPtr group, bool gather_output = false);
  Tensor forward(const Tensor& x) override;  // x replicated; y split (or gathered)
  std::string type_name() const override { return "ColumnParallelLinear"; }
  Tensor weight, bias;
  dist::ProcessGroupPtr group;
  bool gather_output;
};

// y = x W^T + b with W's columns (input features) split: weight [out, in / n], bias [out]
// (replicated, added once after the all-reduce).
class RowParallelLinear : public Module {
 public:
  RowParallelLinear(const Linear& full, dist::ProcessGroupPtr group, bool input_is_parallel = true);
  Tensor forward(const Tensor& x) override;  // x split (or replicated, then scattered); y replicated
  std::string type_name() const override { return "RowParallelLinear"; }
  Tensor weight, bias;
  dist::ProcessGroupPtr group;
  bool input_is_parallel;
};

// GatedMLP with gate_proj/up_proj column-parallel and down_proj row-parallel.
class ParallelGatedMLP : public Module {
 public:
  ParallelGatedMLP(const GatedMLP& full, dist::ProcessGroupPtr group);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ParallelGatedMLP"; }
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;  // local slices (down_proj without bias)
  std::shared_ptr<Module> act;
  Tensor down_bias;  // undefined unless the full MLP had biases
  dist::ProcessGroupPtr group;
};

// nn::Attention with its query and key/value heads split over the group (num_heads and
// num_kv_heads must be multiples of its size): q/k/v_proj column-parallel, o_proj row-parallel,
// q/k RMSNorm weights replicated (their gradients are summed over the group).
class ParallelAttention : public Module {
 public:
  ParallelAttention(const Attention& full, dist::ProcessGroupPtr group);
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep = {});
  Tensor forward(const Tensor& x) override { return forward(x, {}, {}); }
  std::string type_name() const override { return "ParallelAttention"; }
  std::shared_ptr<Attention> local;  // the rank's heads (its children are registered here)
  Tensor o_bias;                     // undefined unless the full attention had one
  dist::ProcessGroupPtr group;
};

// Embedding with the vocabulary split into n equal row blocks: rank r looks up the ids in its
// block (zeros for the others) and the partial embeddings are all-reduced.
class VocabParallelEmbedding : public Module {
 public:
  VocabParallelEmbedding(const Embedding& full, dist::ProcessGroupPtr group);
  Tensor forward(const Tensor& ids) override;
  std::string type_name() const override { return "VocabParallelEmbedding"; }
  Tensor weight;  // [vocab / n, dim]
  int64_t vocab_start = 0, vocab = 0;
  dist::ProcessGroupPtr group;
};

// Mean cross entropy of logits whose class dim is split over the group (each rank holds
// [..., vocab / n], e.g. from a ColumnParallelLinear head without gather), for integer targets
// [...] in [0, vocab): max, sum of exponentials and the target's logit are reduced over the
// group, so no rank ever holds the full logits.
Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& target,
                                    const dist::ProcessGroupPtr& group);

}  // namespace tpu::nn::parallel
