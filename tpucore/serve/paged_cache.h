// The paged key/value cache of the serving engine and its ragged paged attention kernel.
//
// Keys and values live in fixed-size blocks of `block_size` token positions, the same block
// pool shared by every sequence (one pool per layer, [num_blocks, block_size, kv_heads,
// head_dim] in f32 on the host; with a quantized kv_dtype one byte per value, int8 or fp8
// e4m3, and one f32 scale per row of head_dim values, [num_blocks, block_size, kv_heads]). A sequence owns a block table: its i-th logical block (token
// positions [i * block_size, (i + 1) * block_size)) is physical block table[i]. Blocks come
// from a free list (BlockAllocator) and go back to it when a sequence finishes, is cancelled or
// is preempted, so the cache never fragments and a finished request's memory is reusable at
// the next step.
//
// ragged_paged_attention() is one fused step over a ragged batch: sequences of different
// lengths, each bringing any number of new tokens (a prefill chunk or one decode token), all
// flattened into one token axis without padding. For every sequence it first writes the new
// keys and values into the sequence's blocks (through its block table), then every new token
// attends causally to all cached positions of its own sequence, reading the keys and values
// block by block through the same table (the layout of vLLM's ragged paged attention).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "tpucore/nn/transformer.h"

namespace tpu::serve {

// A fixed pool of block ids with reference counts and a free list (least recently freed
// first; lowest id first at the start).
//
// Prefix caching (optional, used by the engine's enable_prefix_caching): a full block can be
// registered under the chain hash of its tokens and of all tokens before it. A later sequence
// with the same prefix finds it (find_cached) and shares it (share: one more reference), so
// its keys and values are not computed again. A registered block whose count drops to 0 stays
// findable on the free list until allocate() hands it out again (its entry is then evicted).
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);
  // A free block id with one reference, or -1 when every block is in use.
  int32_t allocate();
  // Drops one reference; at 0 the block returns to the free list. A block not in use is a
  // tpu::Error.
  void free(int32_t block);
  // Adds a reference to a block in use, or takes a cached free block back from the free list.
  void share(int32_t block);
  int32_t refcount(int32_t block) const;
  int64_t num_blocks() const { return static_cast<int64_t>(ref_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_blocks() - num_free(); }

  static uint64_t chain_hash(uint64_t parent, const int64_t* tokens, int64_t n);
  // The block registered under hash with exactly this parent hash and these tokens, or -1.
  int32_t find_cached(uint64_t hash, uint64_t parent, const std::vector<int64_t>& tokens) const;
  // Registers a block in use (no-op when the hash already names a block or it has an entry).
  void register_cached(int32_t block, uint64_t hash, uint64_t parent, std::vector<int64_t> tokens);

 private:
  struct Entry {
    bool cached = false;
    uint64_t hash = 0, parent = 0;
    std::vector<int64_t> tokens;
  };
  std::list<int32_t> free_;
  std::vector<std::list<int32_t>::iterator> where_;  // position in free_ of free blocks
  std::vector<int32_t> ref_;
  std::vector<Entry> entry_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

struct PagedCacheConfig {
  int64_t num_layers = 0, kv_heads = 0, head_dim = 0;
  int64_t block_size = 16, num_blocks = 0;
  // Keys and values are one array (the caller passes the same rows as both): multi-head latent
  // attention (nn/mla.h) stores its latent once, as the one head of keys and of values.
  bool shared_kv = false;
  // The storage of keys and values (nn::KVCacheDType): auto (float), or int8 / fp8_e4m3 rows
  // with one f32 scale each, quantized when written and dequantized while attention reads them.
  nn::KVCacheDType kv_dtype = nn::KVCacheDType::auto_dtype;
  // Values stored per token and layer: kv_heads * head_dim, twice unless shared_kv.
  int64_t values_per_token_layer() const { return (shared_kv ? 1 : 2) * kv_heads * head_dim; }
  bool quantized() const { return kv_dtype != nn::KVCacheDType::auto_dtype; }
  // Bytes of one token position over all layers, float values of `float_bytes` each when not
  // quantized; quantized: one byte per value plus a 4-byte scale per row of head_dim values.
  int64_t bytes_per_token(int64_t float_bytes) const {
    const int64_t rows = num_layers * (shared_kv ? 1 : 2) * kv_heads;
    return quantized() ? rows * (head_dim + 4) : rows * head_dim * float_bytes;
  }
};

// Keys and values of every layer in blocks on the host: f32, or (cfg.kv_dtype int8 / fp8_e4m3)
// one byte per value and one f32 scale per row.
class PagedKVCache {
 public:
  explicit PagedKVCache(const PagedCacheConfig& c);
  const PagedCacheConfig& config() const { return cfg_; }
  // Row of (block, offset within the block, kv head): head_dim floats (a float cache only).
  float* key(int64_t layer, int64_t block, int64_t offset, int64_t head) {
    check_float("key");
    return k_[static_cast<size_t>(layer)].data() + index(block, offset, head);
  }
  float* value(int64_t layer, int64_t block, int64_t offset, int64_t head) {
    check_float("value");
    return (cfg_.shared_kv ? k_ : v_)[static_cast<size_t>(layer)].data() + index(block, offset, head);
  }
  // Stores head_dim values as the key (value) row of (block, offset, kv head), quantized when
  // the cache is (scale = max |x| / 127 or / 448, 1 for a zero row). A shared_kv cache has one
  // array: write_value writes the same row as write_key.
  void write_key(int64_t layer, int64_t block, int64_t offset, int64_t head, const float* x);
  void write_value(int64_t layer, int64_t block, int64_t offset, int64_t head, const float* x);
  // The row as attention reads it (dequantized: stored value times the row's scale).
  void read_key(int64_t layer, int64_t block, int64_t offset, int64_t head, float* out) const;
  void read_value(int64_t layer, int64_t block, int64_t offset, int64_t head, float* out) const;
  // q . key row, and acc += w * value row, dequantizing on the fly (the scale multiplies the
  // dot product and the weight, not every value).
  float key_dot(int64_t layer, int64_t block, int64_t offset, int64_t head, const float* q) const;
  void value_axpy(int64_t layer, int64_t block, int64_t offset, int64_t head, float w, float* acc) const;
  int64_t bytes() const;

 private:
  size_t index(int64_t block, int64_t offset, int64_t head) const {
    return static_cast<size_t>(((block * cfg_.block_size + offset) * cfg_.kv_heads + head) * cfg_.head_dim);
  }
  size_t row(int64_t block, int64_t offset, int64_t head) const {
    return static_cast<size_t>((block * cfg_.block_size + offset) * cfg_.kv_heads + head);
  }
  void check_float(const char* what) const;
  void write_row(bool value, int64_t layer, int64_t block, int64_t offset, int64_t head, const float* x);
  void read_row(bool value, int64_t layer, int64_t block, int64_t offset, int64_t head, float* out) const;
  PagedCacheConfig cfg_;
  std::vector<std::vector<float>> k_, v_;           // float rows
  std::vector<std::vector<uint8_t>> kq_, vq_;       // quantized rows (int8 or e4m3 bits)
  std::vector<std::vector<float>> ks_, vs_;         // one scale per quantized row
  float f8_table_[256] = {};                        // e4m3 bits -> value
};

// One ragged step: sequence s brings tokens [query_start[s], query_start[s + 1]) of the
// flattened token axis; after the step it holds context_len[s] positions, the new tokens being
// the last ones (positions context_len[s] - q_len .. context_len[s] - 1). block_tables[s] must
// cover every position up to context_len[s].
struct RaggedBatch {
  std::vector<int64_t> query_start;  // num_seqs + 1 offsets, query_start[0] = 0
  std::vector<int64_t> context_len;  // num_seqs
  std::vector<const std::vector<int32_t>*> block_tables;  // num_seqs
  // Per sequence, how many of its new tokens (the first ones) are prompt tokens (empty: not
  // known). The chip's ragged attention program computes those in prefill units and the others
  // one by one in decode units under batch-invariant numerics
  // (codegen::plan_paged_attention); the host kernel ignores it (one order for every token).
  std::vector<int64_t> prompt_tokens;
  int64_t num_seqs() const { return static_cast<int64_t>(context_len.size()); }
  int64_t num_tokens() const { return query_start.empty() ? 0 : query_start.back(); }
  // Checks the offsets, lengths and tables against the cache (a tpu::Error naming the field).
  void validate(const PagedCacheConfig& c) const;
};

// q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, kv_heads, head_dim] (the new
// tokens' keys and values, already rotated); out: [num_tokens, num_heads, head_dim]. Writes k
// and v into `layer` of the cache, then out = softmax(scale * q k^T) v over each token's
// causal context in its own sequence. Query head h reads kv head h / (num_heads / kv_heads).
// window > 0: a token at position p sees keys at (p - window, p] only (a sliding window);
// softcap > 0: scores -> softcap * tanh(scores / softcap) before the softmax (Gemma).
// A quantized cache stores the new rows quantized first, so the step's own tokens are read
// back dequantized, as every later step reads them (as vLLM does).
void ragged_paged_attention(PagedKVCache& cache, int64_t layer, const RaggedBatch& batch, const float* q,
                            const float* k, const float* v, float* out, int64_t num_heads, double scale,
                            int64_t window = 0, double softcap = 0);

}  // namespace tpu::serve
