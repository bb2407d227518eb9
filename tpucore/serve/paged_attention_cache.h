// The serving engine's paged key/value caches behind nn::AttentionCache, so the model's own
// decoder loop (models::DecoderModel::forward) runs a ragged serving step: the tokens of every
// scheduled sequence flattened into one [1, num_tokens] row, each sequence reading and writing
// its own blocks through its block table. Attention's update_and_attend hands over q [1, H, n, d]
// and k, v [1, Hkv, n, d]; every implementation returns [1, n, H * d].
//
// - HostPagedCache: the cache in host memory (PagedKVCache: f32, or int8 / fp8 e4m3 rows with
//   scales) and the cpu kernel ragged_paged_attention (eager steps with the model on the cpu).
//   It alone stores a quantized kv_dtype; the slot caches below refuse one (a tpu::Error).
// - ChipPagedCache: per layer K and V [num_blocks * block_size, kv_heads * head_dim] on a chip
//   that runs generated programs (sim), and the chip's ragged paged attention program
//   (codegen::run_paged_attention), launched eagerly.
// - GraphPagedCache: the same tensors on the model's device (cpu or chip) and the
//   serve_paged_attention op (serve/paged_op.h), an ordinary in-place graph node, so a step
//   traced by tpu::compile holds one node per layer whose shapes depend on the token count only.
// - GatherPagedCache: the same tensors, and the paged attention spelled in ordinary ops that
//   every exporter maps (a scatter of the new keys and values into their slots, a gather of
//   each token's context slots, a masked softmax), for devices that run StableHLO (pjrt),
//   eagerly or traced, with no host fallback.
//
// The slot caches take the step's work-unit data (codegen::PagedAttentionMeta as i32 tensors)
// through set_step() before the forward; inside a traced step these are the graph's inputs.
//
// Every cache implements the per-layer variants (nn::AttentionVariant): a sliding window and
// soft-capped scores go to the kernel (the chip program takes them as constants of its key,
// the graph node as attributes), with the layer's own softmax scale. A step planned with a
// window (pages before the window left out) serves only layers of that window: another layer
// is a tpu::Error.
#pragma once

#include <vector>

#include "codegen/paged_attention.h"
#include "tpucore/nn/transformer.h"
#include "tpucore/serve/paged_cache.h"

namespace tpu::serve {

// The cpu kernel over the host cache. set_batch() names the step's ragged batch (kept by the
// caller for the forward's duration).
class HostPagedCache : public nn::AttentionCache {
 public:
  explicit HostPagedCache(const PagedCacheConfig& c) : cache_(c) {}
  void set_batch(const RaggedBatch* batch) { batch_ = batch; }
  Tensor update_and_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                           double scale) override;
  Tensor update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& keep, double scale, const nn::AttentionVariant& variant) override;
  int64_t num_layers() const override { return cache_.config().num_layers; }
  PagedKVCache& cache() { return cache_; }

 private:
  PagedKVCache cache_;
  const RaggedBatch* batch_ = nullptr;
  std::vector<float> out_;
};

// Per layer K and V [num_blocks * block_size, kv_heads * head_dim] on a device, with the step's
// work-unit data. The step covers `tokens` real tokens; the forward's rows may add padding.
class SlotPagedCache : public nn::AttentionCache {
 public:
  SlotPagedCache(const PagedCacheConfig& c, DType dtype, Device device);
  void set_step(const codegen::PagedAttentionSpec& spec, int64_t tokens, const Tensor& units, const Tensor& pages,
                const Tensor& slots);
  int64_t num_layers() const override { return static_cast<int64_t>(k_.size()); }
  const Tensor& key_cache(int64_t layer) const { return k_[static_cast<size_t>(layer)]; }
  const Tensor& value_cache(int64_t layer) const { return v_[static_cast<size_t>(layer)]; }

 protected:
  // q, k, v token-major and contiguous: [1, n, heads, d].
  struct TokenMajor {
    Tensor q, k, v;
  };
  TokenMajor token_major(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep) const;
  // The step's spec with the layer's scale and variant.
  codegen::PagedAttentionSpec layer_spec(double scale, const nn::AttentionVariant& variant) const;

  std::vector<Tensor> k_, v_;
  codegen::PagedAttentionSpec spec_;
  int64_t tokens_ = 0;
  Tensor units_, pages_, slots_;
};

// The chip's ragged paged attention program, launched eagerly per layer.
class ChipPagedCache : public SlotPagedCache {
 public:
  using SlotPagedCache::SlotPagedCache;
  Tensor update_and_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                           double scale) override {
    return update_and_attend_variant(layer, q, k, v, keep, scale, {});
  }
  Tensor update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& keep, double scale, const nn::AttentionVariant& variant) override;
};

// The serve_paged_attention op: one in-place node per layer when traced.
class GraphPagedCache : public SlotPagedCache {
 public:
  using SlotPagedCache::SlotPagedCache;
  Tensor update_and_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                           double scale) override {
    return update_and_attend_variant(layer, q, k, v, keep, scale, {});
  }
  Tensor update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& keep, double scale, const nn::AttentionVariant& variant) override;
};

// The paged attention as gather + masked softmax. set_gather() gives the step's data on the
// cache's device: write_slots i64 [n] (each token's cache slot), write_mask [n] in the cache's
// dtype (1: a real token, 0: padding, whose keys are not written), context_slots i64 [n * L]
// (the slots of each token's context positions 0..L-1, any slot past its context) and
// distance f32 [n, L] (the token's position minus the key's: keys at distance >= 0, and below
// a layer's sliding window, are attended). Inside tpu::compile these are the graph's inputs and
// the cache writes are functionalized (written back after the run).
class GatherPagedCache : public SlotPagedCache {
 public:
  using SlotPagedCache::SlotPagedCache;
  void set_gather(const Tensor& write_slots, const Tensor& write_mask, const Tensor& context_slots,
                  const Tensor& distance);
  Tensor update_and_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                           double scale) override {
    return update_and_attend_variant(layer, q, k, v, keep, scale, {});
  }
  Tensor update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& keep, double scale, const nn::AttentionVariant& variant) override;

 private:
  Tensor write_slots_, write_mask_, context_slots_, distance_, keep_rows_;
};

}  // namespace tpu::serve
