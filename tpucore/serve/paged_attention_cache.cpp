#include "tpucore/serve/paged_attention_cache.h"

#include <cmath>

#include "codegen/launch.h"
#include "tpucore/ops.h"
#include "tpucore/autograd.h"
#include "tpucore/serve/paged_op.h"

namespace tpu::serve {

namespace {
void check_inputs(const char* who, int64_t layer, int64_t layers, const Tensor& q, const Tensor& k, const Tensor& keep) {
  TPU_CHECK(!keep.defined(), "serve: the {} attends causally within each sequence and takes no keep mask", who);
  TPU_CHECK(layer >= 0 && layer < layers, "serve: layer {} outside the {} of {} layers", layer, who, layers);
  TPU_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(0) == 1 && k.size(0) == 1 && q.size(2) == k.size(2),
            "serve: the {} takes one flattened row of tokens: q [1, H, n, d] and k, v [1, Hkv, n, d], got {} and {}",
            who, q.shape().str(), k.shape().str());
}
}  // namespace

Tensor HostPagedCache::update_and_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& keep, double scale) {
  return update_and_attend_variant(layer, q, k, v, keep, scale, {});
}

Tensor HostPagedCache::update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& keep, double scale,
                                                 const nn::AttentionVariant& variant) {
  check_inputs("host paged cache", layer, num_layers(), q, k, keep);
  const PagedCacheConfig& c = cache_.config();
  const int64_t hq = q.size(1), n = q.size(2), d = q.size(3);
  TPU_CHECK(batch_ && batch_->num_tokens() == n && k.size(1) == c.kv_heads && d == c.head_dim,
            "serve: the host paged cache ({} kv heads, head_dim {}) got {} tokens of {} kv heads x {} for a batch of {}",
            c.kv_heads, c.head_dim, n, k.size(1), d, batch_ ? batch_->num_tokens() : 0);
  NoGradGuard ng;
  auto host_f32 = [](const Tensor& x) { return transpose(x, 1, 2).to(DType::f32).contiguous(); };  // [1, n, h, d]
  const Tensor qt = host_f32(q), kt = host_f32(k), vt = host_f32(v);
  out_.resize(static_cast<size_t>(n * hq * d));
  ragged_paged_attention(cache_, layer, *batch_, qt.data<float>(), kt.data<float>(), vt.data<float>(), out_.data(), hq,
                         scale, variant.window, variant.softcap);
  return from_vector(out_, Shape{1, n, hq * d}, TensorOptions(DType::f32, q.device())).to(q.dtype());
}

SlotPagedCache::SlotPagedCache(const PagedCacheConfig& c, DType dtype, Device device) {
  TPU_CHECK(!c.quantized(),
            "serve: kv cache dtype {} is not implemented by the device paged caches (the chip program, the graph "
            "node, the gather cache); only the host paged cache stores quantized rows",
            nn::kv_cache_dtype_name(c.kv_dtype));
  NoGradGuard ng;
  const int64_t slots = c.num_blocks * c.block_size;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    k_.push_back(zeros(Shape{slots, c.kv_heads * c.head_dim}, TensorOptions(dtype, device)));
    v_.push_back(c.shared_kv ? k_.back() : zeros(Shape{slots, c.kv_heads * c.head_dim}, TensorOptions(dtype, device)));
  }
}

void SlotPagedCache::set_step(const codegen::PagedAttentionSpec& spec, int64_t tokens, const Tensor& units,
                              const Tensor& pages, const Tensor& slots) {
  spec_ = spec;
  tokens_ = tokens;
  units_ = units;
  pages_ = pages;
  slots_ = slots;
}

SlotPagedCache::TokenMajor SlotPagedCache::token_major(int64_t layer, const Tensor& q, const Tensor& k,
                                                       const Tensor& v, const Tensor& keep) const {
  check_inputs("paged cache", layer, num_layers(), q, k, keep);
  TPU_CHECK(units_.defined(), "serve: the paged cache has no step data (set_step before the forward)");
  TPU_CHECK(q.size(1) == spec_.heads && k.size(1) == spec_.kv_heads && q.size(3) == spec_.head_dim,
            "serve: the paged cache's spec ({} heads, {} kv heads, head_dim {}) does not fit q {} and k {}", spec_.heads,
            spec_.kv_heads, spec_.head_dim, q.shape().str(), k.shape().str());
  auto tm = [](const Tensor& x) { return transpose(x, 1, 2).contiguous(); };
  return {tm(q), tm(k), tm(v)};
}

codegen::PagedAttentionSpec SlotPagedCache::layer_spec(double scale, const nn::AttentionVariant& variant) const {
  TPU_CHECK(scale > 0 && variant.window >= 0 && variant.softcap >= 0,
            "serve: the paged cache got scale {}, window {}, softcap {}", scale, variant.window, variant.softcap);
  TPU_CHECK(spec_.window == 0 || spec_.window == variant.window,
            "serve: the step was planned for sliding-window layers of window {} (pages before the window left out); "
            "a layer with window {} cannot use it",
            spec_.window, variant.window);
  codegen::PagedAttentionSpec s = spec_;
  s.scale = static_cast<float>(scale);
  s.window = variant.window;
  s.softcap = static_cast<float>(variant.softcap);
  return s;
}

Tensor ChipPagedCache::update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& keep, double scale,
                                                 const nn::AttentionVariant& variant) {
  const TokenMajor t = token_major(layer, q, k, v, keep);
  const int64_t rows = q.size(2), hq = q.size(1), d = q.size(3);
  Tensor out = empty(Shape{1, rows, hq * d}, TensorOptions(q.dtype(), q.device()));
  codegen::run_paged_attention(layer_spec(scale, variant), tokens_, t.q, t.k, t.v, k_[static_cast<size_t>(layer)],
                               v_[static_cast<size_t>(layer)], out, units_, pages_, slots_);
  return out;
}

Tensor GraphPagedCache::update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                                  const Tensor& keep, double scale,
                                                  const nn::AttentionVariant& variant) {
  const TokenMajor t = token_major(layer, q, k, v, keep);
  const int64_t rows = q.size(2), hq = q.size(1), hkv = k.size(1), d = q.size(3);
  const Tensor a = paged_attention(layer_spec(scale, variant), reshape(t.q, Shape{rows, hq * d}), reshape(t.k, Shape{rows, hkv * d}),
                                   reshape(t.v, Shape{rows, hkv * d}), k_[static_cast<size_t>(layer)],
                                   v_[static_cast<size_t>(layer)], units_, pages_, slots_);
  return reshape(a, Shape{1, rows, hq * d});
}

void GatherPagedCache::set_gather(const Tensor& write_slots, const Tensor& write_mask, const Tensor& context_slots,
                                  const Tensor& distance) {
  const int64_t n = write_slots.numel();
  TPU_CHECK(n > 0 && write_mask.numel() == n && distance.dim() == 2 && distance.size(0) == n &&
                context_slots.numel() == n * distance.size(1) && write_slots.dtype() == DType::i64 &&
                context_slots.dtype() == DType::i64,
            "serve: the gather paged cache's step data do not agree: write slots {}, mask {}, context slots {}, "
            "distances {}",
            write_slots.shape().str(), write_mask.shape().str(), context_slots.shape().str(), distance.shape().str());
  write_slots_ = write_slots;
  write_mask_ = reshape(write_mask, Shape{n, 1});
  context_slots_ = context_slots;
  distance_ = distance;
  // Rows about to be overwritten are zeroed first (the scatter adds): 1 - (real writes per slot).
  const int64_t slots = k_.front().size(0);
  const Tensor keep = scatter_add(ones(Shape{slots}, TensorOptions(write_mask.dtype(), write_mask.device())), 0,
                                  write_slots, neg(reshape(write_mask, Shape{n})));
  keep_rows_ = reshape(keep, Shape{slots, 1});
}

Tensor GatherPagedCache::update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                                   const Tensor& keep, double scale,
                                                   const nn::AttentionVariant& variant) {
  check_inputs("gather paged cache", layer, num_layers(), q, k, keep);
  TPU_CHECK(write_slots_.defined(), "serve: the gather paged cache has no step data (set_gather before the forward)");
  TPU_CHECK(scale > 0 && variant.window >= 0 && variant.softcap >= 0,
            "serve: the gather paged cache got scale {}, window {}, softcap {}", scale, variant.window, variant.softcap);
  const int64_t hq = q.size(1), n = q.size(2), d = q.size(3), hkv = k.size(1), g = hq / hkv;
  const int64_t ctx = distance_.size(1), row = hkv * d;
  TPU_CHECK(n == write_slots_.numel() && row == k_.front().size(1) && hq % hkv == 0,
            "serve: the gather paged cache ({} slots of {} values) got {} tokens of {} kv heads x {} for a step of {}",
            k_.front().size(0), k_.front().size(1), n, hkv, d, write_slots_.numel());
  auto token_rows = [](const Tensor& x) { return transpose(x, 1, 2).contiguous(); };  // [1, n, h, d]
  // Constants as 0-d tensors on the device (a plain number would be a host operand).
  auto constant = [](double v, const Tensor& like) { return full(Shape{}, v, TensorOptions(like.dtype(), like.device())); };
  // The new keys and values into their slots (padding rows add zeros to slot rows they keep).
  const Tensor idx = expand(reshape(write_slots_, Shape{n, 1}), Shape{n, row}).contiguous();
  Tensor& kc = k_[static_cast<size_t>(layer)];
  Tensor& vc = v_[static_cast<size_t>(layer)];
  kc.copy_(scatter_add(kc * keep_rows_, 0, idx, reshape(token_rows(k), Shape{n, row}) * write_mask_));
  if (!vc.is_same(kc))  // one array for both (the MLA latent): written once
    vc.copy_(scatter_add(vc * keep_rows_, 0, idx, reshape(token_rows(v), Shape{n, row}) * write_mask_));
  // Each token's context: [n, hkv, d, L] keys and [n, hkv, L, d] values.
  const Tensor keys = permute(reshape(index_select(kc, 0, context_slots_), Shape{n, ctx, hkv, d}), Shape{0, 2, 3, 1});
  const Tensor values = permute(reshape(index_select(vc, 0, context_slots_), Shape{n, ctx, hkv, d}), Shape{0, 2, 1, 3});
  Tensor scores = matmul(reshape(token_rows(q), Shape{n, hkv, g, d}), keys);  // [n, hkv, g, L]
  scores = scores * constant(scale, scores);
  if (variant.softcap > 0)
    scores = tanh(scores * constant(1.0 / variant.softcap, scores)) * constant(variant.softcap, scores);
  Tensor visible = ge(distance_, constant(0.0, distance_));
  if (variant.window > 0)
    visible = logical_and(visible, lt(distance_, constant(static_cast<double>(variant.window), distance_)));
  scores = where(reshape(visible, Shape{n, 1, 1, ctx}), scores, constant(-INFINITY, scores));
  const Tensor out = matmul(softmax(scores, -1), values);  // [n, hkv, g, d]
  return reshape(out, Shape{1, n, hq * d});
}

}  // namespace tpu::serve
