#include "tpucore/models/causal_lm.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "tpucore/autograd.h"
#include "tpucore/fused_ops.h"
#include "tpucore/nn/fused_path.h"
#include "tpucore/models/generate.h"

namespace tpu::models {

namespace {
// Holds the decoder layers under the names "0", "1", ... (Hugging Face's model.layers.N).
class LayerList : public nn::Module {
 public:
  explicit LayerList(std::vector<std::shared_ptr<DecoderLayer>> ls) {
    for (size_t i = 0; i < ls.size(); ++i) register_module(std::to_string(i), ls[i]);
  }
  std::string type_name() const override { return "ModuleList"; }
};

nn::AttentionConfig attention_config(const ModelConfig& c, int64_t layer) {
  nn::AttentionConfig a;
  a.hidden = c.hidden_size;
  a.num_heads = c.num_attention_heads;
  a.num_kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  a.qkv_bias = c.attention_bias;
  a.o_bias = c.o_bias;
  a.qk_norm = c.qk_norm;
  a.norm_eps = c.rms_norm_eps;
  a.unit_offset_norm = c.gemma;
  if (c.query_pre_attn_scalar > 0) a.scaling = 1.0 / std::sqrt(c.query_pre_attn_scalar);
  a.variant.softcap = c.attn_logit_softcapping;
  if (c.is_sliding(layer)) a.variant.window = c.sliding_window;
  return a;
}

std::shared_ptr<nn::RMSNorm> make_norm(const ModelConfig& c, int64_t n) {
  if (c.gemma) return std::make_shared<nn::UnitOffsetRMSNorm>(Shape{n}, c.rms_norm_eps);
  return std::make_shared<nn::RMSNorm>(Shape{n}, c.rms_norm_eps);
}

// Gemma 3's sliding layers rotate with their own base (packed tables, CausalLM::rope_tables).
bool has_local_rope(const ModelConfig& c) {
  if (c.rope_local_base_freq <= 0) return false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (c.is_sliding(i)) return true;
  return false;
}

// DeepSeek-V3's softmax scale: 1 / sqrt(nope + rope), times yarn's mscale(factor, mscale_all_dim)^2.
nn::MLAConfig mla_config(const ModelConfig& c) {
  nn::MLAConfig a;
  a.hidden = c.hidden_size;
  a.num_heads = c.num_attention_heads;
  a.q_lora_rank = c.q_lora_rank;
  a.kv_lora_rank = c.kv_lora_rank;
  a.qk_nope_head_dim = c.qk_nope_head_dim;
  a.qk_rope_head_dim = c.qk_rope_head_dim;
  a.v_head_dim = c.v_head_dim;
  a.bias = c.attention_bias;
  a.rope_interleave = c.rope_interleave;
  a.scaling = 1.0 / std::sqrt(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim));
  const double factor = c.rope_scaling.factor, all_dim = c.rope_scaling.mscale_all_dim;
  if (all_dim != 0 && factor > 1) {
    const double m = 0.1 * all_dim * std::log(factor) + 1.0;
    a.scaling *= m * m;
  }
  return a;
}
}  // namespace

DecoderLayer::DecoderLayer(const ModelConfig& c, Generator* gen, int64_t index) {
  if (c.mla())
    mla = register_module("self_attn", std::make_shared<nn::MLAttention>(mla_config(c), gen));
  else
    self_attn = register_module("self_attn", std::make_shared<nn::Attention>(attention_config(c, index), gen));
  if (c.is_sparse(index)) {
    nn::MoEConfig m;
    m.hidden = c.hidden_size;
    m.intermediate = c.moe_intermediate_size;
    m.num_experts = c.num_experts;
    m.top_k = c.num_experts_per_tok;
    m.norm_topk_prob = c.norm_topk_prob;
    m.act = c.hidden_act;
    m.router_jitter_noise = c.router_jitter_noise;
    m.capacity_factor = c.capacity_factor;
    if (c.model_type == "deepseek_v3") {
      m.sigmoid_routing = true;
      m.n_group = c.n_group;
      m.topk_group = c.topk_group;
      m.routed_scaling_factor = c.routed_scaling_factor;
      m.shared_intermediate = c.moe_intermediate_size * c.n_shared_experts;
    }
    TPU_CHECK(!c.mlp_bias, "DecoderLayer: mlp_bias is not supported with mixture-of-experts layers");
    moe = register_module(c.model_type == "mixtral" ? "block_sparse_moe" : "mlp",
                          std::make_shared<nn::SparseMoE>(m, gen));
  } else {
    mlp = register_module("mlp", std::make_shared<nn::GatedMLP>(c.hidden_size, c.intermediate_size, c.hidden_act,
                                                                c.mlp_bias, gen));
  }
  input_layernorm = register_module("input_layernorm", make_norm(c, c.hidden_size));
  post_attention_layernorm = register_module("post_attention_layernorm", make_norm(c, c.hidden_size));
  if (c.gemma) {
    pre_feedforward_layernorm = register_module("pre_feedforward_layernorm", make_norm(c, c.hidden_size));
    post_feedforward_layernorm = register_module("post_feedforward_layernorm", make_norm(c, c.hidden_size));
  }
  local_rope = has_local_rope(c) && c.is_sliding(index);
  packed_rope = has_local_rope(c);
}

namespace {
// A plain RMSNorm (not Gemma's, no hooks) that add_rms_norm can stand for.
bool fusable_norm(const nn::RMSNorm& n) {
  return n.type_name() == "RMSNorm" && !n.has_forward_hooks() && n.weight.defined() && n.normalized_shape.ndim() == 1;
}
// Whether (x + a, norm(x + a)) may run as one add_rms_norm (the chain's values, tpucore/fused_ops.h).
bool fusable_sum(const Tensor& x, const Tensor& a, const nn::RMSNorm& n) {
  return fusable_norm(n) && nn::detail::fused_path_ok({&x, &a, &n.weight}) && x.dtype() == a.dtype() &&
         x.shape() == a.shape() && is_floating(a.dtype()) && n.normalized_shape[0] == x.size(-1);
}
// The layer's attention of its normed input y (through the attention's hooks).
Tensor attend(DecoderLayer& l, const Tensor& y, const Tensor& cos, const Tensor& sin, const Tensor& keep,
              nn::AttentionCache* cache, int64_t layer) {
  Tensor c = cos, s = sin;
  if (l.packed_rope && cos.defined()) {  // [global | local] along the last dim
    const int64_t r = cos.size(-1) / 2;
    c = narrow(cos, cos.dim() - 1, l.local_rope ? r : 0, r);
    s = narrow(sin, sin.dim() - 1, l.local_rope ? r : 0, r);
  }
  if (l.mla)
    return l.mla->call({y}, [&](std::span<const Tensor> xs) { return l.mla->forward(xs[0], c, s, keep, cache, layer); });
  return l.self_attn->call({y}, [&](std::span<const Tensor> xs) {
    return l.self_attn->forward(xs[0], c, s, keep, cache, layer);
  });
}
}  // namespace


Tensor DecoderLayer::forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep,
                             nn::AttentionCache* cache, int64_t layer) {
  // Through the layer's forward hooks (fully_shard, parallelism applied from outside).
  return call({x}, [&](std::span<const Tensor> in) {
    Tensor a = attend(*this, (*input_layernorm)(in[0]), cos, sin, keep, cache, layer);
    if (!pre_feedforward_layernorm) {
      // The residual sum and the norm after it in one pass on the cpu.
      if (fusable_sum(in[0], a, *post_attention_layernorm)) {
        auto [h, y] = add_rms_norm(in[0], a, post_attention_layernorm->weight, post_attention_layernorm->eps);
        return add(h, feed_forward()(y));
      }
      Tensor h = add(in[0], a);
      return add(h, feed_forward()((*post_attention_layernorm)(h)));
    }
    Tensor h = add(in[0], (*post_attention_layernorm)(a));
    return add(h, (*post_feedforward_layernorm)(feed_forward()((*pre_feedforward_layernorm)(h))));
  });
}

DecoderModel::DecoderModel(const ModelConfig& c, Generator* gen) {
  embed_tokens = register_module("embed_tokens", std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size, gen));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers.push_back(std::make_shared<DecoderLayer>(c, gen, i));
  register_module("layers", std::make_shared<LayerList>(layers));
  norm = register_module("norm", make_norm(c, c.hidden_size));
  if (c.gemma) embed_scale = std::sqrt(static_cast<double>(c.hidden_size));
}

Tensor DecoderModel::forward(const Tensor& ids, const Tensor& cos, const Tensor& sin, const Tensor& keep,
                             nn::AttentionCache* cache) {
  Tensor h = (*embed_tokens)(ids);
  if (embed_scale != 1.0) {
    // Gemma multiplies by sqrt(hidden) rounded to the activations' dtype.
    const auto f = static_cast<float>(embed_scale);
    const float scale = h.dtype() == DType::bf16 ? static_cast<float>(bf16(f))
                        : h.dtype() == DType::f16 ? static_cast<float>(f16(f))
                                                  : f;
    h = mul(h, static_cast<double>(scale));
  }
  // Pre-norm layers without hooks on the cpu: each residual sum is fused with the norm after it
  // (the layer's own, the next layer's input norm, the final norm): add_rms_norm, the chain's
  // values. The first layer that does not qualify takes the layers' forward from there on.
  auto plain = [&](const DecoderLayer& l) {
    return !l.pre_feedforward_layernorm && !l.has_forward_hooks() && fusable_norm(*l.input_layernorm) &&
           fusable_norm(*l.post_attention_layernorm);
  };
  size_t i = 0;
  if (!layers.empty() && plain(*layers[0]) && nn::detail::fused_path_ok({&h, &layers[0]->input_layernorm->weight})) {
    Tensor y = (*layers[0]->input_layernorm)(h);  // the first layer's normed input
    for (; i < layers.size(); ++i) {
      DecoderLayer& l = *layers[i];
      const Tensor a = attend(l, y, cos, sin, keep, cache, static_cast<int64_t>(i));
      Tensor h2, y2;
      if (fusable_sum(h, a, *l.post_attention_layernorm)) {
        std::tie(h2, y2) = add_rms_norm(h, a, l.post_attention_layernorm->weight, l.post_attention_layernorm->eps);
      } else {
        h2 = add(h, a);
        y2 = (*l.post_attention_layernorm)(h2);
      }
      const Tensor f = l.feed_forward()(y2);
      if (i + 1 < layers.size() && !plain(*layers[i + 1])) {  // the layers' forward from the next one on
        h = add(h2, f);
        ++i;
        break;
      }
      nn::RMSNorm& next = i + 1 < layers.size() ? *layers[i + 1]->input_layernorm : *norm;
      if (fusable_sum(h2, f, next)) {
        std::tie(h, y) = add_rms_norm(h2, f, next.weight, next.eps);
      } else {
        h = add(h2, f);
        y = next(h);
      }
      if (i + 1 == layers.size()) return y;  // the final norm's output
    }
  }
  for (; i < layers.size(); ++i) h = layers[i]->forward(h, cos, sin, keep, cache, static_cast<int64_t>(i));
  return (*norm)(h);
}

CausalLM::CausalLM(const ModelConfig& c, Generator* gen) : config(c) {
  TPU_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0 &&
                c.num_attention_heads > 0,
            "CausalLM: vocab_size ({}), hidden_size ({}), intermediate_size ({}), num_hidden_layers ({}) and "
            "num_attention_heads ({}) must be positive",
            c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads);
  model = register_module("model", std::make_shared<DecoderModel>(c, gen));
  if (c.mla()) {
    config.head_dim = c.qk_rope_head_dim;  // the rotary tables' width
  } else {
    config.head_dim = model->layers[0]->self_attn->cfg.head_dim;
    config.num_key_value_heads = model->layers[0]->self_attn->cfg.num_kv_heads;
  }
  if (!c.tie_word_embeddings)
    lm_head = register_module("lm_head", std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size, false, gen));
  const nn::RopeFrequencies f =
      nn::rope_frequencies(config.head_dim, c.rope_theta, c.rope_scaling, static_cast<double>(c.max_position_embeddings));
  inv_freq = f.inv_freq;
  rope_attention_scaling = f.attention_scaling;
  if (has_local_rope(c)) {
    nn::RopeScaling local;
    local.partial_rotary_factor = c.rope_scaling.partial_rotary_factor;
    local_inv_freq = nn::rope_frequencies(config.head_dim, c.rope_local_base_freq, local).inv_freq;
  }
}

CausalLM::~CausalLM() { release_generation_state(*this); }

DType CausalLM::dtype() const { return model->norm->weight.dtype(); }
Device CausalLM::device() const { return model->norm->weight.device(); }

nn::KVCache CausalLM::make_cache(int64_t batch, int64_t capacity) const {
  if (config.mla()) {  // the compressed latents (nn/mla.h), one head of half their width
    TPU_CHECK(kv_dtype() == nn::KVCacheDType::auto_dtype,
              "CausalLM: the {} KV cache is not supported with multi-head latent attention (MLA)",
              nn::kv_cache_dtype_name(kv_dtype()));
    return nn::KVCache(config.num_hidden_layers, batch, 1, capacity,
                       nn::mla_cache_head_dim(config.kv_lora_rank, config.qk_rope_head_dim), dtype(), device());
  }
  return nn::KVCache(config.num_hidden_layers, batch, config.num_key_value_heads, capacity, config.head_dim,
                     nn::kv_cache_storage_dtype(kv_dtype(), dtype()), device());
}

Tensor CausalLM::forward(const Tensor& ids, nn::KVCache* cache, const std::vector<int64_t>& positions,
                         const Tensor& keep) {
  TPU_CHECK(ids.defined() && ids.dim() == 2 && is_integral(ids.dtype()),
            "CausalLM: expected integer token ids [batch, seq], got {}",
            ids.defined() ? fmt::format("{} of shape {}", dtype_name(ids.dtype()), ids.shape().str()) : "undefined");
  const int64_t b = ids.size(0), t = ids.size(1);
  TPU_CHECK(t > 0, "CausalLM: empty sequence (ids of shape {})", ids.shape().str());
  if (cache)
    TPU_CHECK(cache->batch() == b && cache->num_layers() == config.num_hidden_layers,
              "CausalLM: the cache holds batch {} x {} layers, the input is batch {} for {} layers", cache->batch(),
              cache->num_layers(), b, config.num_hidden_layers);
  std::vector<int64_t> pos = positions;
  if (pos.empty()) {
    const int64_t past = cache ? cache->length() : 0;
    for (int64_t r = 0; r < b; ++r)
      for (int64_t i = 0; i < t; ++i) pos.push_back(past + i);
  }
  TPU_CHECK(static_cast<int64_t>(pos.size()) == b * t, "CausalLM: {} position ids given for input of shape {}",
            pos.size(), ids.shape().str());
  auto [cos, sin] = rope_tables(pos, b);
  Tensor out = forward(ids, cos, sin, cache, keep);
  if (cache) cache->advance(t);
  return out;
}

Tensor CausalLM::forward(const Tensor& ids, const Tensor& cos, const Tensor& sin, nn::AttentionCache* cache,
                         const Tensor& keep) {
  return logits(hidden_states(ids, cos, sin, cache, keep));
}

Tensor CausalLM::hidden_states(const Tensor& ids, const Tensor& cos, const Tensor& sin, nn::AttentionCache* cache,
                               const Tensor& keep) {
  if (cache)
    TPU_CHECK(cache->num_layers() == config.num_hidden_layers, "CausalLM: the attention cache holds {} layers, the model {}",
              cache->num_layers(), config.num_hidden_layers);
  return model->forward(ids, cos, sin, keep, cache);
}

Tensor CausalLM::logits(const Tensor& hidden) const {
  Tensor out = lm_head ? (*lm_head)(hidden) : linear(hidden, model->embed_tokens->weight);
  const double cap = config.final_logit_softcapping;
  if (cap > 0) out = mul(tanh(div(out, cap)), cap);
  return out;
}

std::pair<Tensor, Tensor> CausalLM::rope_tables(const std::vector<int64_t>& positions, int64_t batch) const {
  std::vector<double> freq = inv_freq;
  double scaling = rope_attention_scaling;
  if (nn::rope_depends_on_length(config.rope_scaling) && !positions.empty()) {
    // dynamic / longrope: the frequencies of the sequence length the largest position implies.
    const int64_t len = *std::max_element(positions.begin(), positions.end()) + 1;
    const nn::RopeFrequencies f = nn::rope_frequencies(config.head_dim, config.rope_theta, config.rope_scaling,
                                                       static_cast<double>(config.max_position_embeddings), len);
    freq = f.inv_freq;
    scaling = f.attention_scaling;
  }
  auto tables = nn::rope_tables(positions, batch, freq, dtype(), device(), scaling);
  if (local_inv_freq.empty()) return tables;
  auto local = nn::rope_tables(positions, batch, local_inv_freq, dtype(), device());
  NoGradGuard ng;
  return {cat({tables.first, local.first}, 3), cat({tables.second, local.second}, 3)};
}

Tensor router_aux_loss(const CausalLM& m) {
  std::vector<Tensor> logits;
  for (const auto& l : m.model->layers)
    if (l->moe) logits.push_back(l->moe->router_logits);
  TPU_CHECK(!logits.empty(), "router_aux_loss: model_type '{}' has no mixture-of-experts layers",
            m.config.model_type);
  TPU_CHECK(m.config.model_type != "deepseek_v3", "router_aux_loss: model_type 'deepseek_v3' balances its experts "
            "with e_score_correction_bias; it has no auxiliary loss");
  Tensor loss = mul(nn::load_balancing_loss(logits, m.config.num_experts, m.config.num_experts_per_tok),
                    m.config.router_aux_loss_coef);
  if (m.config.router_z_loss_coef != 0) loss = add(loss, mul(nn::router_z_loss(logits), m.config.router_z_loss_coef));
  return loss;
}

}  // namespace tpu::models
