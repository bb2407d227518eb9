#include "tpucore/serve/compiled_step.h"

#include <algorithm>
#include <cmath>

#include "tpucore/autograd.h"
#include "tpucore/compile.h"

namespace tpu::serve {

namespace {
int64_t pow2_at_least(int64_t n, int64_t lo) {
  int64_t b = lo;
  while (b < n) b *= 2;
  return b;
}
}  // namespace

int64_t CompiledStep::token_bucket(int64_t n) { return pow2_at_least(n, 8); }
int64_t CompiledStep::context_bucket(int64_t n) { return pow2_at_least(n, 16); }

CompiledStep::CompiledStep(models::CausalLM& m, const PagedCacheConfig& c, const std::string& name,
                           int64_t max_tokens, int64_t max_context)
    : m_(m), c_(c), max_tokens_(max_tokens), max_context_(max_context) {
  TPU_CHECK(c.num_layers == m.config.num_hidden_layers && c.kv_heads == m.config.num_key_value_heads &&
                c.head_dim == m.config.head_dim,
            "serve: the paged cache ({} layers, {} kv heads, head_dim {}) does not fit the model", c.num_layers,
            c.kv_heads, c.head_dim);
  NoGradGuard ng;
  const int64_t slots = c.num_blocks * c.block_size;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    k_.push_back(zeros(Shape{slots, c.kv_heads * c.head_dim}, TensorOptions(m.dtype(), m.device())));
    v_.push_back(zeros(Shape{slots, c.kv_heads * c.head_dim}, TensorOptions(m.dtype(), m.device())));
  }
  auto step = [this](const Tensor& ids, const Tensor& cos, const Tensor& sin, const Tensor& src, const Tensor& hit,
                     const Tensor& ctx, const Tensor& mask) {
    const models::ModelConfig& mc = m_.config;
    const int64_t nb = ids.size(1), lb = mask.size(3), hq = mc.num_attention_heads, hkv = mc.num_key_value_heads,
                  d = mc.head_dim;
    Tensor h = m_.model->embed_tokens->forward(ids);
    for (size_t li = 0; li < m_.model->layers.size(); ++li) {
      models::DecoderLayer& layer = *m_.model->layers[li];
      nn::Attention& at = *layer.self_attn;
      Tensor x = layer.input_layernorm->forward(h);
      Tensor q = reshape(at.q_proj->forward(x), Shape{1, nb, hq, d});
      Tensor k = reshape(at.k_proj->forward(x), Shape{1, nb, hkv, d});
      Tensor v = at.v_proj->forward(x);
      if (at.q_norm) {
        q = at.q_norm->forward(q);
        k = at.k_norm->forward(k);
      }
      q = rotary_embedding(transpose(q, 1, 2), cos, sin);  // [1, H, Nb, d]
      k = transpose(rotary_embedding(transpose(k, 1, 2), cos, sin), 1, 2);
      // Fused cache update: each slot takes its writer's row (or keeps its value).
      Tensor kf = reshape(k, Shape{nb, hkv * d}), vf = reshape(v, Shape{nb, hkv * d});
      Tensor& kc = k_[li];
      Tensor& vc = v_[li];
      copy_(kc, where(hit, index_select(kf, 0, src), kc));
      copy_(vc, where(hit, index_select(vf, 0, src), vc));
      // Each token's context read through its block table: [Nb, Hkv, Lb, d].
      Tensor kk = transpose(reshape(index_select(kc, 0, ctx), Shape{nb, lb, hkv, d}), 1, 2);
      Tensor vv = transpose(reshape(index_select(vc, 0, ctx), Shape{nb, lb, hkv, d}), 1, 2);
      Tensor a = scaled_dot_product_attention(transpose(q, 0, 2), kk, vv, mask, false,
                                              1.0 / std::sqrt(static_cast<double>(d)));  // [Nb, H, 1, d]
      a = reshape(a, Shape{1, nb, hq * d});
      h = add(h, at.o_proj->forward(a));
      h = add(h, layer.mlp->forward(layer.post_attention_layernorm->forward(h)));
    }
    h = m_.model->norm->forward(h);
    return linear(h, m_.lm_head ? m_.lm_head->weight : m_.model->embed_tokens->weight);
  };
  int64_t pairs = 0;
  for (int64_t nb = token_bucket(1); nb <= token_bucket(max_tokens); nb *= 2)
    for (int64_t lb = context_bucket(1); lb <= context_bucket(max_context); lb *= 2) ++pairs;
  fn_ = tpu::compile(step, CompileOptions{.name = name, .warn_after_recompiles = static_cast<int>(pairs)});
}

int64_t CompiledStep::warm_up() {
  const int64_t max_tokens = max_tokens_, max_context = max_context_;
  NoGradGuard ng;
  const Device dev = m_.device();
  const int64_t slots = c_.num_blocks * c_.block_size;
  int64_t pairs = 0;
  for (int64_t nb = token_bucket(1); nb <= token_bucket(max_tokens); nb *= 2)
    for (int64_t lb = context_bucket(1); lb <= context_bucket(max_context); lb *= 2) {
      std::vector<bool> keep(static_cast<size_t>(nb * lb), false);
      for (int64_t t = 0; t < nb; ++t) keep[static_cast<size_t>(t * lb)] = true;
      auto [cos, sin] = nn::rope_tables(std::vector<int64_t>(static_cast<size_t>(nb), 0), 1, m_.inv_freq, m_.dtype(), dev);
      fn_(zeros(Shape{1, nb}, TensorOptions(DType::i64, dev)), cos, sin, zeros(Shape{slots}, TensorOptions(DType::i64, dev)),
          zeros(Shape{slots, 1}, TensorOptions(DType::boolean, dev)),  // no slot is written
          zeros(Shape{nb * lb}, TensorOptions(DType::i64, dev)),
          from_vector(keep, Shape{nb, 1, 1, lb}, TensorOptions(DType::boolean, dev)));
      ++pairs;
    }
  return pairs;
}

Tensor CompiledStep::run(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
                         const RaggedBatch& rb, const std::vector<int64_t>& logit_rows) {
  rb.validate(c_);
  const auto n = static_cast<int64_t>(ids.size());
  TPU_CHECK(n > 0 && static_cast<int64_t>(positions.size()) == n && rb.num_tokens() == n,
            "serve: {} token ids, {} positions and a batch of {} tokens must agree (and be non-empty)", n,
            positions.size(), rb.num_tokens());
  int64_t longest = 1;
  for (int64_t c : rb.context_len) longest = std::max(longest, c);
  const int64_t nb = token_bucket(n), lb = context_bucket(longest), bs = c_.block_size;
  const int64_t slots = c_.num_blocks * bs;
  std::vector<int64_t> tok(static_cast<size_t>(nb), 0), pos(static_cast<size_t>(nb), 0), ctx(static_cast<size_t>(nb * lb), 0);
  std::vector<int64_t> src(static_cast<size_t>(slots), 0);
  std::vector<bool> hit(static_cast<size_t>(slots), false), keep(static_cast<size_t>(nb * lb), false);
  std::copy(ids.begin(), ids.end(), tok.begin());
  std::copy(positions.begin(), positions.end(), pos.begin());
  for (int64_t s = 0; s < rb.num_seqs(); ++s) {
    const auto si = static_cast<size_t>(s);
    const int64_t t0 = rb.query_start[si], t1 = rb.query_start[si + 1], first = rb.context_len[si] - (t1 - t0);
    const std::vector<int32_t>& table = *rb.block_tables[si];
    auto slot = [&](int64_t p) { return table[static_cast<size_t>(p / bs)] * bs + p % bs; };
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = first + (t - t0);
      src[static_cast<size_t>(slot(p))] = t;
      hit[static_cast<size_t>(slot(p))] = true;
      for (int64_t j = 0; j <= p; ++j) {
        ctx[static_cast<size_t>(t * lb + j)] = slot(j);
        keep[static_cast<size_t>(t * lb + j)] = true;
      }
    }
  }
  for (int64_t t = n; t < nb; ++t) keep[static_cast<size_t>(t * lb)] = true;  // padding rows see slot 0
  NoGradGuard ng;
  const Device dev = m_.device();
  auto [cos, sin] = nn::rope_tables(pos, 1, m_.inv_freq, m_.dtype(), dev);
  Tensor logits = fn_(from_vector(tok, Shape{1, nb}, TensorOptions(DType::i64, dev)), cos, sin,
                      from_vector(src, Shape{slots}, TensorOptions(DType::i64, dev)),
                      from_vector(hit, Shape{slots, 1}, TensorOptions(DType::boolean, dev)),
                      from_vector(ctx, Shape{nb * lb}, TensorOptions(DType::i64, dev)),
                      from_vector(keep, Shape{nb, 1, 1, lb}, TensorOptions(DType::boolean, dev)));
  const auto rows = static_cast<int64_t>(logit_rows.size());
  if (rows == 0) return zeros(Shape{0, m_.config.vocab_size}, TensorOptions(DType::f32, dev));
  Tensor sel = index_select(reshape(logits, Shape{nb, m_.config.vocab_size}), 0,
                            from_vector(logit_rows, Shape{rows}, TensorOptions(DType::i64, dev)));
  return sel.to(DType::f32).to(Device()).contiguous();
}

}  // namespace tpu::serve
