#include "tpucore/models/causal_lm.h"

#include "tpucore/autograd.h"
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

nn::AttentionConfig attention_config(const ModelConfig& c) {
  nn::AttentionConfig a;
  a.hidden = c.hidden_size;
  a.num_heads = c.num_attention_heads;
  a.num_kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  a.qkv_bias = c.attention_bias;
  a.o_bias = c.o_bias;
  a.qk_norm = c.qk_norm;
  a.norm_eps = c.rms_norm_eps;
  return a;
}
}  // namespace

DecoderLayer::DecoderLayer(const ModelConfig& c, Generator* gen) {
  self_attn = register_module("self_attn", std::make_shared<nn::Attention>(attention_config(c), gen));
  mlp = register_module("mlp", std::make_shared<nn::GatedMLP>(c.hidden_size, c.intermediate_size, c.hidden_act,
                                                              c.mlp_bias, gen));
  input_layernorm = register_module("input_layernorm", std::make_shared<nn::RMSNorm>(Shape{c.hidden_size}, c.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<nn::RMSNorm>(Shape{c.hidden_size}, c.rms_norm_eps));
}

Tensor DecoderLayer::forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep,
                             nn::AttentionCache* cache, int64_t layer) {
  // Through the layer's forward hooks (fully_shard, parallelism applied from outside).
  return call({x}, [&](std::span<const Tensor> in) {
    Tensor a = self_attn->call({(*input_layernorm)(in[0])}, [&](std::span<const Tensor> xs) {
      return self_attn->forward(xs[0], cos, sin, keep, cache, layer);
    });
    Tensor h = add(in[0], a);
    return add(h, (*mlp)((*post_attention_layernorm)(h)));
  });
}

DecoderModel::DecoderModel(const ModelConfig& c, Generator* gen) {
  embed_tokens = register_module("embed_tokens", std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size, gen));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers.push_back(std::make_shared<DecoderLayer>(c, gen));
  register_module("layers", std::make_shared<LayerList>(layers));
  norm = register_module("norm", std::make_shared<nn::RMSNorm>(Shape{c.hidden_size}, c.rms_norm_eps));
}

Tensor DecoderModel::forward(const Tensor& ids, const Tensor& cos, const Tensor& sin, const Tensor& keep,
                             nn::AttentionCache* cache) {
  Tensor h = (*embed_tokens)(ids);
  for (size_t i = 0; i < layers.size(); ++i) h = layers[i]->forward(h, cos, sin, keep, cache, static_cast<int64_t>(i));
  return (*norm)(h);
}

CausalLM::CausalLM(const ModelConfig& c, Generator* gen) : config(c) {
  TPU_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0 &&
                c.num_attention_heads > 0,
            "CausalLM: vocab_size ({}), hidden_size ({}), intermediate_size ({}), num_hidden_layers ({}) and "
            "num_attention_heads ({}) must be positive",
            c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads);
  model = register_module("model", std::make_shared<DecoderModel>(c, gen));
  config.head_dim = model->layers[0]->self_attn->cfg.head_dim;
  config.num_key_value_heads = model->layers[0]->self_attn->cfg.num_kv_heads;
  if (!c.tie_word_embeddings)
    lm_head = register_module("lm_head", std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size, false, gen));
  inv_freq = nn::rope_inv_freq(config.head_dim, c.rope_theta, c.rope_scaling);
}

CausalLM::~CausalLM() { release_generation_state(*this); }

DType CausalLM::dtype() const { return model->norm->weight.dtype(); }
Device CausalLM::device() const { return model->norm->weight.device(); }

nn::KVCache CausalLM::make_cache(int64_t batch, int64_t capacity) const {
  return nn::KVCache(config.num_hidden_layers, batch, config.num_key_value_heads, capacity, config.head_dim, dtype(),
                     device());
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
  return lm_head ? (*lm_head)(hidden) : linear(hidden, model->embed_tokens->weight);
}

std::pair<Tensor, Tensor> CausalLM::rope_tables(const std::vector<int64_t>& positions, int64_t batch) const {
  return nn::rope_tables(positions, batch, inv_freq, dtype(), device());
}

}  // namespace tpu::models
