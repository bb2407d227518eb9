#include "tpucore/nn/parallel/tensor_parallel.h"

#include "tpucore/autograd.h"
#include "tpucore/nn/parallel/function.h"
#include "tpucore/ops.h"

namespace tpu::nn::parallel {

using detail::attach_backward;
using detail::fresh_alias;

namespace {

const dist::ProcessGroupPtr& checked(const dist::ProcessGroupPtr& g, const char* who) {
  TPU_CHECK(g != nullptr && g->is_member(), "{}: this rank is not a member of the tensor-parallel group", who);
  return g;
}

Tensor allreduced(const Tensor& x, const dist::ProcessGroupPtr& g) {
  NoGradGuard ng;
  Tensor t = x.detach().contiguous().clone();
  g->all_reduce(t, dist::ReduceOp::sum);
  return t;
}

// All-gathers x from every rank and concatenates along the last dim.
Tensor gathered_last(const Tensor& x, const dist::ProcessGroupPtr& g) {
  NoGradGuard ng;
  const int n = g->size();
  Tensor in = x.detach().contiguous();
  Shape s = in.shape();
  Shape os = s;
  os[0] = s[0] * n;
  Tensor out = detail::collective_buffer(os, TensorOptions(in.dtype(), in.device()));
  g->all_gather_into_tensor(out, in);
  return cat(chunk(out, n, 0), -1).contiguous();
}

Tensor my_slice_last(const Tensor& x, const dist::ProcessGroupPtr& g, const char* who) {
  const int n = g->size();
  const int64_t last = x.size(-1);
  TPU_CHECK(last % n == 0, "{}: the last dim ({}) is not a multiple of the group size {}", who, last, n);
  return narrow(x, -1, g->rank() * (last / n), last / n).contiguous();
}

// Rows (dim 0) or columns (dim 1) block `rank` of n of a full parameter, as a new leaf.
Tensor block_of(const Tensor& full, int dim, const dist::ProcessGroupPtr& g, const char* who, const char* what) {
  // A quantized layer's codes (i8, packed u8) copied into a float layer would lose their scales.
  TPU_CHECK(is_floating(full.dtype()),
            "{}: {} has dtype {} (a quantized layer's weight); these layers take float weights: split an "
            "nn::QuantizedLinear with parallelize_module (ColwiseParallel / RowwiseParallel), which shards its scales",
            who, what, dtype_name(full.dtype()));
  const int n = g->size();
  TPU_CHECK(full.size(dim) % n == 0, "{}: {} has {} {} , not a multiple of the tensor-parallel size {}", who, what,
            full.size(dim), dim == 0 ? "rows" : "columns", n);
  NoGradGuard ng;
  const int64_t k = full.size(dim) / n;
  Tensor t = narrow(full.detach(), dim, g->rank() * k, k).contiguous().clone();
  t.requires_grad_(true);
  return t;
}

Tensor replica_of(const Tensor& full) {
  NoGradGuard ng;
  Tensor t = full.detach().clone();
  t.requires_grad_(true);
  return t;
}

}  // namespace

Tensor copy_to_tp(const Tensor& x, const dist::ProcessGroupPtr& group) {
  const auto& g = checked(group, "copy_to_tp");
  if (g->size() == 1) return x;
  Tensor ins[1] = {x}, outs[1] = {fresh_alias(x)};
  attach_backward("tp_copy", ins, outs, [g](std::span<const Tensor> go, std::span<Tensor> gi) { gi[0] = allreduced(go[0], g); }, true);
  return outs[0];
}

Tensor reduce_from_tp(const Tensor& x, const dist::ProcessGroupPtr& group) {
  const auto& g = checked(group, "reduce_from_tp");
  if (g->size() == 1) return x;
  Tensor ins[1] = {x}, outs[1] = {allreduced(x, g)};
  attach_backward("tp_reduce", ins, outs, [](std::span<const Tensor> go, std::span<Tensor> gi) { gi[0] = go[0]; }, true);
  return outs[0];
}

Tensor gather_from_tp(const Tensor& x, const dist::ProcessGroupPtr& group) {
  const auto& g = checked(group, "gather_from_tp");
  TPU_CHECK(x.dim() >= 1, "gather_from_tp: expected at least one dim, got a scalar");
  if (g->size() == 1) return x;
  Tensor ins[1] = {x}, outs[1] = {gathered_last(x, g)};
  attach_backward("tp_gather", ins, outs, [g](std::span<const Tensor> go, std::span<Tensor> gi) {
    gi[0] = my_slice_last(go[0], g, "gather_from_tp backward");
  }, true);
  return outs[0];
}

Tensor scatter_to_tp(const Tensor& x, const dist::ProcessGroupPtr& group) {
  const auto& g = checked(group, "scatter_to_tp");
  TPU_CHECK(x.dim() >= 1, "scatter_to_tp: expected at least one dim, got a scalar");
  if (g->size() == 1) return x;
  Tensor out;
  {
    NoGradGuard ng;
    out = my_slice_last(x.detach(), g, "scatter_to_tp").clone();
  }
  Tensor ins[1] = {x}, outs[1] = {out};
  attach_backward("tp_scatter", ins, outs, [g](std::span<const Tensor> go, std::span<Tensor> gi) {
    gi[0] = gathered_last(go[0], g);
  }, true);
  return outs[0];
}

ColumnParallelLinear::ColumnParallelLinear(const Linear& full, dist::ProcessGroupPtr g, bool gather)
    : group(std::move(g)), gather_output(gather) {
  checked(group, "ColumnParallelLinear");
  weight = block_of(full.weight, 0, group, "ColumnParallelLinear", "the weight");
  register_parameter("weight", weight);
  if (full.bias.defined()) {
    bias = block_of(full.bias, 0, group, "ColumnParallelLinear", "the bias");
    register_parameter("bias", bias);
  }
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  TPU_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == weight.size(1),
            "ColumnParallelLinear: expected an input with {} features in the last dim, got {}", weight.size(1),
            x.defined() ? x.shape().str() : std::string("undefined"));
  Tensor y = linear(copy_to_tp(x, group), weight, bias);
  return gather_output ? gather_from_tp(y, group) : y;
}

RowParallelLinear::RowParallelLinear(const Linear& full, dist::ProcessGroupPtr g, bool parallel_in)
    : group(std::move(g)), input_is_parallel(parallel_in) {
  checked(group, "RowParallelLinear");
  weight = block_of(full.weight, 1, group, "RowParallelLinear", "the weight");
  register_parameter("weight", weight);
  if (full.bias.defined()) {
    bias = replica_of(full.bias);
    register_parameter("bias", bias);
  }
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  Tensor in = input_is_parallel ? x : scatter_to_tp(x, group);
  TPU_CHECK(in.defined() && in.dim() >= 1 && in.size(-1) == weight.size(1),
            "RowParallelLinear: expected this rank's {} input features in the last dim, got {}", weight.size(1),
            in.defined() ? in.shape().str() : std::string("undefined"));
  Tensor y = reduce_from_tp(linear(in, weight), group);
  return bias.defined() ? add(y, bias) : y;
}

ParallelGatedMLP::ParallelGatedMLP(const GatedMLP& full, dist::ProcessGroupPtr g) : group(std::move(g)) {
  checked(group, "ParallelGatedMLP");
  const int64_t hidden = full.gate_proj->weight.size(1), inter = full.gate_proj->weight.size(0);
  TPU_CHECK(inter % group->size() == 0, "ParallelGatedMLP: intermediate size {} is not a multiple of the tensor-parallel size {}",
            inter, group->size());
  const int64_t k = inter / group->size();
  const bool has_bias = full.gate_proj->bias.defined();
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(hidden, k, has_bias));
  up_proj = register_module("up_proj", std::make_shared<Linear>(hidden, k, has_bias));
  down_proj = register_module("down_proj", std::make_shared<Linear>(k, hidden, false));
  act = register_module("act", std::make_shared<Lambda>(full.act->type_name(), [a = full.act](const Tensor& t) {
                          return a->forward(t);
                        }));
  NoGradGuard ng;
  gate_proj->weight.copy_(block_of(full.gate_proj->weight, 0, group, "ParallelGatedMLP", "gate_proj.weight"));
  up_proj->weight.copy_(block_of(full.up_proj->weight, 0, group, "ParallelGatedMLP", "up_proj.weight"));
  down_proj->weight.copy_(block_of(full.down_proj->weight, 1, group, "ParallelGatedMLP", "down_proj.weight"));
  if (has_bias) {
    gate_proj->bias.copy_(block_of(full.gate_proj->bias, 0, group, "ParallelGatedMLP", "gate_proj.bias"));
    up_proj->bias.copy_(block_of(full.up_proj->bias, 0, group, "ParallelGatedMLP", "up_proj.bias"));
    down_bias = replica_of(full.down_proj->bias);
    register_parameter("down_bias", down_bias);
  }
}

Tensor ParallelGatedMLP::forward(const Tensor& x) {
  Tensor xin = copy_to_tp(x, group);  // one all-reduce of the input gradient for gate and up
  Tensor h = mul(act->forward(linear(xin, gate_proj->weight, gate_proj->bias)), linear(xin, up_proj->weight, up_proj->bias));
  Tensor y = reduce_from_tp(linear(h, down_proj->weight), group);
  return down_bias.defined() ? add(y, down_bias) : y;
}

ParallelAttention::ParallelAttention(const Attention& full, dist::ProcessGroupPtr g) : group(std::move(g)) {
  checked(group, "ParallelAttention");
  const int n = group->size();
  const AttentionConfig& c = full.cfg;
  TPU_CHECK(c.num_heads % n == 0 && c.num_kv_heads % n == 0,
            "ParallelAttention: {} query and {} key/value heads do not split over {} ranks (both must be multiples)",
            c.num_heads, c.num_kv_heads, n);
  AttentionConfig lc = c;
  lc.num_heads = c.num_heads / n;
  lc.num_kv_heads = c.num_kv_heads / n;
  lc.o_bias = false;
  local = std::make_shared<Attention>(lc);
  NoGradGuard ng;
  auto take = [&](Linear& dst, const Linear& src, int dim, const char* what) {
    dst.weight.copy_(block_of(src.weight, dim, group, "ParallelAttention", what));
    if (src.bias.defined() && dim == 0) dst.bias.copy_(block_of(src.bias, 0, group, "ParallelAttention", what));
  };
  take(*local->q_proj, *full.q_proj, 0, "q_proj");
  take(*local->k_proj, *full.k_proj, 0, "k_proj");
  take(*local->v_proj, *full.v_proj, 0, "v_proj");
  take(*local->o_proj, *full.o_proj, 1, "o_proj");
  if (c.qk_norm) {
    local->q_norm->weight.copy_(full.q_norm->weight);
    local->k_norm->weight.copy_(full.k_norm->weight);
  }
  for (auto& [name, child] : local->named_children()) register_module(name, child);
  if (full.o_proj->bias.defined()) {
    o_bias = replica_of(full.o_proj->bias);
    register_parameter("o_bias", o_bias);
  }
}

Tensor ParallelAttention::forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep) {
  // The q/k norm weights see only this rank's heads: their gradients are summed over the group.
  std::vector<std::pair<Tensor*, Tensor>> replicated;
  if (local->q_norm)
    for (Tensor* w : {&local->q_norm->weight, &local->k_norm->weight}) {
      replicated.emplace_back(w, *w);
      *w = copy_to_tp(*w, group);
    }
  Tensor y;
  try {
    y = local->forward(copy_to_tp(x, group), cos, sin, keep);
  } catch (...) {
    for (auto& [slot, t] : replicated) *slot = t;
    throw;
  }
  for (auto& [slot, t] : replicated) *slot = t;
  y = reduce_from_tp(y, group);
  return o_bias.defined() ? add(y, o_bias) : y;
}

VocabParallelEmbedding::VocabParallelEmbedding(const Embedding& full, dist::ProcessGroupPtr g) : group(std::move(g)) {
  checked(group, "VocabParallelEmbedding");
  weight = block_of(full.weight, 0, group, "VocabParallelEmbedding", "the vocabulary");
  register_parameter("weight", weight);
  vocab = full.weight.size(0);
  vocab_start = group->rank() * weight.size(0);
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) {
  TPU_CHECK(ids.defined() && (ids.dtype() == DType::i64 || ids.dtype() == DType::i32),
            "VocabParallelEmbedding: expected integer ids, got {}", ids.defined() ? dtype_name(ids.dtype()) : "undefined");
  Tensor mine, local;
  {
    NoGradGuard ng;
    Tensor id = ids.to(DType::i64);
    mine = logical_and(ge(id, Scalar(vocab_start)), lt(id, Scalar(vocab_start + weight.size(0))));
    local = where(mine, sub(id, Scalar(vocab_start)), Scalar(int64_t{0}));
  }
  Tensor e = embedding(weight, local);
  e = mul(e, unsqueeze(mine, -1).to(e.dtype()));
  return reduce_from_tp(e, group);
}

Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& target, const dist::ProcessGroupPtr& group) {
  const auto& g = checked(group, "vocab_parallel_cross_entropy");
  TPU_CHECK(local_logits.defined() && target.defined() && local_logits.dim() == target.dim() + 1 &&
                local_logits.numel() / std::max<int64_t>(1, local_logits.size(-1)) == target.numel(),
            "vocab_parallel_cross_entropy: logits [..., V/n] and targets [...] disagree: {} and {}",
            local_logits.defined() ? local_logits.shape().str() : "undefined",
            target.defined() ? target.shape().str() : "undefined");
  const int64_t k = local_logits.size(-1), start = g->rank() * k;
  Tensor l = local_logits.reshape(Shape{-1, k});
  if (l.dtype() != DType::f32) l = l.to(DType::f32);
  Tensor m, mine, idx;
  {
    NoGradGuard ng;
    m = amax(l.detach(), {1}, true);
    g->all_reduce(m, dist::ReduceOp::max);
    Tensor t = target.reshape(Shape{-1}).to(DType::i64);
    Tensor lo = min(t), hi = max(t);
    TPU_CHECK(lo.is_proxy() || (lo.item<int64_t>() >= 0 && hi.item<int64_t>() < k * g->size()),
              "vocab_parallel_cross_entropy: targets must be in [0, {}), got [{}, {}]", k * g->size(),
              lo.item<int64_t>(), hi.item<int64_t>());  // checked where the targets are host values
    mine = logical_and(ge(t, Scalar(start)), lt(t, Scalar(start + k)));
    idx = unsqueeze(where(mine, sub(t, Scalar(start)), Scalar(int64_t{0})), 1);
  }
  Tensor z = sub(l, m);
  Tensor sumexp = reduce_from_tp(sum(exp(z), {1}), g);
  Tensor picked = reduce_from_tp(mul(squeeze(gather(z, 1, idx), 1), mine.to(DType::f32)), g);
  return mean(sub(log(sumexp), picked));
}

}  // namespace tpu::nn::parallel
