// parallelize_module: parameters replaced by this rank's blocks, collectives in forward hooks.
#include "tpucore/nn/parallel/parallelize.h"

#include <memory>

#include "tpucore/autograd.h"
#include "tpucore/nn/layers.h"
#include "tpucore/nn/mla.h"
#include "tpucore/nn/parallel/expert_parallel.h"
#include "tpucore/nn/parallel/tensor_parallel.h"
#include "tpucore/nn/quantized.h"
#include "tpucore/ops.h"

namespace tpu::nn::parallel {

ParallelStyle ColwiseParallel(Layout input, Layout output) {
  return {ParallelStyle::Kind::colwise, input, output};
}
ParallelStyle RowwiseParallel(Layout input, Layout output) {
  return {ParallelStyle::Kind::rowwise, input, output};
}
ParallelStyle ReplicateParallel(Layout input, Layout output) {
  return {ParallelStyle::Kind::replicate, input, output};
}
ParallelStyle SequenceParallel() { return ReplicateParallel(Layout::shard_seq, Layout::shard_seq); }
ParallelStyle PrepareModuleOutput(Layout from, Layout to) {
  return {ParallelStyle::Kind::prepare_output, from, to};
}
ParallelStyle PrepareModuleInput(Layout from, Layout to) {
  return {ParallelStyle::Kind::prepare_input, from, to};
}
ParallelStyle ExpertParallel() { return {ParallelStyle::Kind::expert, Layout::replicate, Layout::replicate}; }
ParallelStyle LatentAttentionParallel() {
  return {ParallelStyle::Kind::latent_attention, Layout::replicate, Layout::replicate};
}

namespace {

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::replicate: return "replicate";
    case Layout::shard_last: return "shard_last";
    case Layout::shard_seq: return "shard_seq";
  }
  return "?";
}

// Dim 1 and the last dim swapped: the sequence collectives are the last-dim ones in between.
Tensor seq_last(const Tensor& x, const char* who) {
  TPU_CHECK(x.dim() >= 2, "{}: a sequence layout needs an activation [batch, seq, ...], got shape {}", who,
            x.shape().str());
  return x.dim() == 2 ? x : transpose(x, 1, -1);
}

// From one layout to another, with the conjugate collective in backward: a replicated tensor's
// gradient is whole on every rank, a shard's is the rank's part of it.
Tensor redistribute(const Tensor& x, Layout from, Layout to, const dist::ProcessGroupPtr& g, const std::string& who) {
  if (from == to) return x;
  const char* w = who.c_str();
  if (from == Layout::replicate && to == Layout::shard_last) return scatter_to_tp(x, g);
  if (from == Layout::shard_last && to == Layout::replicate) return gather_from_tp(x, g);
  if (from == Layout::replicate && to == Layout::shard_seq) {
    TPU_CHECK(x.dim() >= 2 && x.size(1) % g->size() == 0,
              "{}: the sequence ({} of shape {}) does not split over {} ranks", who, x.dim() >= 2 ? x.size(1) : 0,
              x.shape().str(), g->size());
    Tensor t = seq_last(x, w);
    Tensor s = scatter_to_tp(t.contiguous(), g);
    return x.dim() == 2 ? s : transpose(s, 1, -1);
  }
  if (from == Layout::shard_seq && to == Layout::replicate) {
    Tensor t = seq_last(x, w);
    Tensor s = gather_from_tp(t.contiguous(), g);
    return x.dim() == 2 ? s : transpose(s, 1, -1);
  }
  fail("{}: no redistribution from {} to {}", who, layout_name(from), layout_name(to));
}

bool matches(const std::string& pattern, const std::string& name) {
  size_t p = 0, n = 0;
  while (true) {
    const size_t pe = pattern.find('.', p), ne = name.find('.', n);
    const std::string pc = pattern.substr(p, pe == std::string::npos ? std::string::npos : pe - p);
    const std::string nc = name.substr(n, ne == std::string::npos ? std::string::npos : ne - n);
    if (pc != "*" && pc != nc) return false;
    if (pe == std::string::npos || ne == std::string::npos) return pe == ne;
    p = pe + 1;
    n = ne + 1;
  }
}

// This rank's block of `full` along `dim` as a new leaf (full.size(dim) must divide by n).
Tensor block(const Tensor& full, int dim, const dist::ProcessGroupPtr& g, const std::string& who, const char* what) {
  const int n = g->size();
  TPU_CHECK(full.size(dim) % n == 0, "parallelize_module: {}.{} has {} {}, not a multiple of the tensor-parallel size {}",
            who, what, full.size(dim), dim == 0 ? "rows" : "columns", n);
  NoGradGuard ng;
  const int64_t k = full.size(dim) / n;
  Tensor t = narrow(full.detach(), dim, g->rank() * k, k).contiguous().clone();
  t.requires_grad_(full.requires_grad());
  return t;
}

// This rank's part of a quantized weight and its scales. Column parallelism splits the output
// rows: the per-row scales ([N]) and the int4 group scales ([N, K / group]) go with their rows,
// fp8 block scales by blocks of block_n rows. Row parallelism splits the input features: the
// per-row scales stay whole (every column of a row has the row's scale), the int4 group scales
// and fp8 block scales split along K with their columns. A split that cuts a group or a block
// is a tpu::Error naming the numbers.
void shard_quantized(QuantizedLinear& q, bool col, const dist::ProcessGroupPtr& g, const std::string& name) {
  const int64_t n = g->size(), N = q.weight.size(0), K = q.in_features;
  const char* fmt_name = weight_quant_name(q.kind);
  if (col) {
    TPU_CHECK(N % n == 0, "parallelize_module: {} ({} QuantizedLinear) has {} output features, not a multiple of the "
              "tensor-parallel size {}", name, fmt_name, N, n);
    if (q.block_n > 0)
      TPU_CHECK((N / n) % q.block_n == 0,
                "parallelize_module: {} ({} QuantizedLinear, scale blocks of {}x{}): column parallelism over {} ranks "
                "gives {} output features per rank, which cuts a block of {} rows",
                name, fmt_name, q.block_n, q.block_k, n, N / n, q.block_n);
    q.weight = block(q.weight, 0, g, name, "weight");
    q.weight_scale = block(q.weight_scale, 0, g, name, "weight_scale");
    return;
  }
  TPU_CHECK(K % n == 0, "parallelize_module: {} ({} QuantizedLinear) has {} input features, not a multiple of the "
            "tensor-parallel size {}", name, fmt_name, K, n);
  const int64_t k = K / n;
  if (q.kind == WeightQuant::int4) {
    TPU_CHECK(k % q.group == 0,
              "parallelize_module: {} (int4 QuantizedLinear, groups of {} input features): row parallelism over {} "
              "ranks gives {} input features per rank, which cuts a group of {}",
              name, q.group, n, k, q.group);
    q.weight = block(q.weight, 1, g, name, "weight");  // packed: k / 2 bytes per row, whole 32-weight chunks
    q.weight_scale = block(q.weight_scale, 1, g, name, "weight_scale");
  } else if (q.block_k > 0) {
    TPU_CHECK(k % q.block_k == 0,
              "parallelize_module: {} (fp8 QuantizedLinear, scale blocks of {}x{}): row parallelism over {} ranks "
              "gives {} input features per rank, which cuts a block of {} columns",
              name, q.block_n, q.block_k, n, k, q.block_k);
    q.weight = block(q.weight, 1, g, name, "weight");
    q.weight_scale = block(q.weight_scale, 1, g, name, "weight_scale");
  } else {
    q.weight = block(q.weight, 1, g, name, "weight");  // one scale per output row: whole on every rank
  }
  q.in_features = k;
}

// The slots of `m`'s own parameters, swapped for copy_to_tp aliases while a forward runs (their
// gradients are then summed over the group).
struct ReplicatedParams {
  std::vector<std::pair<Tensor*, Tensor>> saved;
  void enter(Module& m, const dist::ProcessGroupPtr& g) {
    for (auto& [n, slot] : m.parameter_slots(false)) {
      saved.emplace_back(slot, *slot);
      *slot = copy_to_tp(*slot, g);
    }
  }
  void leave() {
    for (auto& [slot, t] : saved) *slot = t;
    saved.clear();
  }
};

void apply(const std::string& name, Module& m, const ParallelStyle& st, const dist::ProcessGroupPtr& g) {
  using K = ParallelStyle::Kind;
  const Layout in = st.input, out = st.output;
  if (st.kind == K::colwise || st.kind == K::rowwise) {
    auto* lin = dynamic_cast<Linear*>(&m);
    TPU_CHECK(lin != nullptr, "parallelize_module: {} is a {}, but {} parallelism needs a Linear", name, m.type_name(),
              st.kind == K::colwise ? "column" : "row");
    const bool col = st.kind == K::colwise;
    TPU_CHECK(col ? (in == Layout::replicate || in == Layout::shard_seq) && out != Layout::shard_seq
                  : (in == Layout::replicate || in == Layout::shard_last) && out != Layout::shard_last,
              "parallelize_module: {}: {} parallelism cannot take {} input to {} output", name, col ? "column" : "row",
              layout_name(in), layout_name(out));
    if (auto* ql = dynamic_cast<QuantizedLinear*>(lin)) shard_quantized(*ql, col, g, name);
    else lin->weight = block(lin->weight, col ? 0 : 1, g, name, "weight");
    if (col && lin->bias.defined()) lin->bias = block(lin->bias, 0, g, name, "bias");
    if (col) {
      m.register_forward_pre_hook([g, in, name](Module&, std::vector<Tensor>& x) {
        x[0] = copy_to_tp(redistribute(x[0], in, Layout::replicate, g, name), g);
      });
      m.register_forward_hook([g, out, name](Module&, std::span<const Tensor>, Tensor& y) {
        y = redistribute(y, Layout::shard_last, out, g, name);
      });
      return;
    }
    // Row: the bias is added once, after the partial outputs are summed.
    auto stash = std::make_shared<Tensor>();
    m.register_forward_pre_hook([g, in, name, lin, stash](Module&, std::vector<Tensor>& x) {
      x[0] = redistribute(x[0], in, Layout::shard_last, g, name);
      *stash = lin->bias;
      lin->bias = Tensor();
    });
    m.register_forward_hook(
        [g, out, name, lin, stash](Module&, std::span<const Tensor>, Tensor& y) {
          if (stash->defined()) lin->bias = *stash;
          *stash = Tensor();
          if (!y.defined()) return;
          y = reduce_from_tp(y, g);
          if (lin->bias.defined()) y = add(y, lin->bias);
          y = redistribute(y, Layout::replicate, out, g, name);
        },
        true);
    return;
  }
  if (st.kind == K::expert) {
    auto* moe = dynamic_cast<SparseMoE*>(&m);
    TPU_CHECK(moe != nullptr, "parallelize_module: {} is a {}, but expert parallelism needs a SparseMoE", name,
              m.type_name());
    expert_parallel(*moe, g);
    return;
  }
  if (st.kind == K::latent_attention) {
    auto* mla = dynamic_cast<MLAttention*>(&m);
    TPU_CHECK(mla != nullptr, "parallelize_module: {} is a {}, but latent attention parallelism needs an MLAttention",
              name, m.type_name());
    const int64_t r = mla->cfg.kv_lora_rank, dr = mla->cfg.qk_rope_head_dim;
    mla->kv_a_proj_with_mqa->register_forward_hook([g, r, dr](Module&, std::span<const Tensor>, Tensor& y) {
      if (y.defined()) y = cat({narrow(y, -1, 0, r), copy_to_tp(narrow(y, -1, r, dr), g)}, -1);
    });
    return;
  }
  if (st.kind == K::prepare_input) {
    m.register_forward_pre_hook([g, in, out, name](Module&, std::vector<Tensor>& x) {
      TPU_CHECK(!x.empty(), "parallelize_module: {}: the module's hooked forward has no tensor input", name);
      x[0] = redistribute(x[0], in, out, g, name);
    });
    return;
  }
  if (st.kind == K::prepare_output) {
    m.register_forward_hook([g, in, out, name](Module&, std::span<const Tensor>, Tensor& y) {
      y = redistribute(y, in, out, g, name);
    });
    return;
  }
  TPU_CHECK(in != Layout::shard_last && out != Layout::shard_last,
            "parallelize_module: {}: replicated parameters take replicate or shard_seq activations", name);
  auto params = std::make_shared<ReplicatedParams>();
  m.register_forward_pre_hook([g, params](Module& self, std::vector<Tensor>&) { params->enter(self, g); });
  m.register_forward_hook(
      [g, in, out, name, params](Module&, std::span<const Tensor>, Tensor& y) {
        params->leave();
        if (y.defined()) y = redistribute(y, in, out, g, name);
      },
      true);
}

}  // namespace

void parallelize_module(Module& root, const dist::ProcessGroupPtr& group, const ParallelPlan& plan) {
  TPU_CHECK(group != nullptr && group->is_member(), "parallelize_module: this rank is not a member of the group");
  auto modules = root.named_modules();
  for (const auto& [pattern, style] : plan) {
    int hits = 0;
    for (auto& [name, m] : modules)
      if (matches(pattern, name)) {
        apply(name, *m, style, group);
        ++hits;
      }
    TPU_CHECK(hits > 0, "parallelize_module: the plan's pattern '{}' matches no module of the {}", pattern,
              root.type_name());
  }
}

ParallelPlan causal_lm_plan(const Module& model, bool sequence) {
  bool qk_norm = false, head = false, dense = false, sparse = false, latent = false, q_lora = false;
  for (auto& [name, m] : model.named_modules()) {
    if (const auto* a = dynamic_cast<const MLAttention*>(m.get())) {
      latent = true;
      q_lora = a->q_b_proj != nullptr;
    }
    if (matches("model.layers.*.self_attn.q_norm", name)) qk_norm = true;
    if (matches("model.layers.*.mlp.gate_proj", name)) dense = true;
    if (dynamic_cast<const SparseMoE*>(m.get()) != nullptr) sparse = true;
    if (name == "lm_head") head = true;
  }
  // A sparse block on sequence shards would route each rank's shard with router and expert
  // gradients of that shard only: not implemented.
  TPU_CHECK(!(sequence && sparse), "causal_lm_plan: sequence parallelism of a model with mixture-of-experts "
            "(SparseMoE) blocks is not supported; use sequence = false (the sparse blocks then see the whole "
            "sequence; expert_parallel shards their experts over another mesh axis)");
  const Layout stream = sequence ? Layout::shard_seq : Layout::replicate;
  ParallelPlan p;
  if (sequence) {
    p.emplace_back("model.embed_tokens", PrepareModuleOutput(Layout::replicate, Layout::shard_seq));
    p.emplace_back("model.layers.*.input_layernorm", SequenceParallel());
    p.emplace_back("model.layers.*.post_attention_layernorm", SequenceParallel());
    p.emplace_back("model.norm", ReplicateParallel(Layout::shard_seq, Layout::replicate));
    // Attention mixes positions: it takes the whole sequence.
    p.emplace_back("model.layers.*.self_attn", PrepareModuleInput(Layout::shard_seq, Layout::replicate));
  }
  if (latent) {  // multi-head latent attention: heads split, the latent path whole
    p.emplace_back(q_lora ? "model.layers.*.self_attn.q_b_proj" : "model.layers.*.self_attn.q_proj", ColwiseParallel());
    p.emplace_back("model.layers.*.self_attn.kv_b_proj", ColwiseParallel());
    p.emplace_back("model.layers.*.self_attn", LatentAttentionParallel());
  } else {
    for (const char* n : {"q_proj", "k_proj", "v_proj"})
      p.emplace_back(std::string("model.layers.*.self_attn.") + n, ColwiseParallel());
  }
  p.emplace_back("model.layers.*.self_attn.o_proj", RowwiseParallel(Layout::shard_last, stream));
  if (qk_norm) {
    p.emplace_back("model.layers.*.self_attn.q_norm", ReplicateParallel());
    p.emplace_back("model.layers.*.self_attn.k_norm", ReplicateParallel());
  }
  if (dense) {  // the dense MLPs (a mixture-of-experts model's sparse blocks stay whole)
    p.emplace_back("model.layers.*.mlp.gate_proj", ColwiseParallel(stream));
    p.emplace_back("model.layers.*.mlp.up_proj", ColwiseParallel(stream));
    p.emplace_back("model.layers.*.mlp.down_proj", RowwiseParallel(Layout::shard_last, stream));
  }
  if (head) p.emplace_back("lm_head", ColwiseParallel(Layout::replicate, Layout::replicate));
  return p;
}

}  // namespace tpu::nn::parallel
