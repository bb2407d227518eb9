#include "tpucore/serve/paged_cache.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/kernels/kv_rows.h"
#include "tpucore/core/error.h"
#include "tpucore/core/float8.h"
#include "tpucore/core/parallel.h"

namespace tpu::serve {

BlockAllocator::BlockAllocator(int64_t n) {
  TPU_CHECK(n > 0 && n < (int64_t{1} << 31), "BlockAllocator: need 0 < num_blocks < 2^31, got {}", n);
  ref_.assign(static_cast<size_t>(n), 0);
  entry_.resize(static_cast<size_t>(n));
  where_.resize(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; ++b) where_[static_cast<size_t>(b)] = free_.insert(free_.end(), static_cast<int32_t>(b));
}

int32_t BlockAllocator::allocate() {
  if (free_.empty()) return -1;
  const int32_t b = free_.front();
  free_.pop_front();
  Entry& e = entry_[static_cast<size_t>(b)];
  if (e.cached) {  // evict its prefix entry: the block gets new contents
    by_hash_.erase(e.hash);
    e = Entry{};
  }
  ref_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockAllocator::free(int32_t b) {
  TPU_CHECK(b >= 0 && b < num_blocks() && ref_[static_cast<size_t>(b)] > 0,
            "BlockAllocator: block {} is not in use (pool of {} blocks)", b, num_blocks());
  if (--ref_[static_cast<size_t>(b)] == 0) where_[static_cast<size_t>(b)] = free_.insert(free_.end(), b);
}

void BlockAllocator::share(int32_t b) {
  TPU_CHECK(b >= 0 && b < num_blocks() && (ref_[static_cast<size_t>(b)] > 0 || entry_[static_cast<size_t>(b)].cached),
            "BlockAllocator: block {} is neither in use nor cached", b);
  if (ref_[static_cast<size_t>(b)]++ == 0) free_.erase(where_[static_cast<size_t>(b)]);
}

int32_t BlockAllocator::refcount(int32_t b) const {
  TPU_CHECK(b >= 0 && b < num_blocks(), "BlockAllocator: block {} outside the pool of {}", b, num_blocks());
  return ref_[static_cast<size_t>(b)];
}

uint64_t BlockAllocator::chain_hash(uint64_t parent, const int64_t* tokens, int64_t n) {
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ULL;  // FNV-1a style mixing of the parent and the ids
  for (int64_t i = 0; i < n; ++i) {
    h ^= static_cast<uint64_t>(tokens[i]) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0x100000001b3ULL;
  }
  return h;
}

int32_t BlockAllocator::find_cached(uint64_t hash, uint64_t parent, const std::vector<int64_t>& tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const Entry& e = entry_[static_cast<size_t>(it->second)];
  return e.parent == parent && e.tokens == tokens ? it->second : -1;
}

void BlockAllocator::register_cached(int32_t b, uint64_t hash, uint64_t parent, std::vector<int64_t> tokens) {
  TPU_CHECK(b >= 0 && b < num_blocks() && ref_[static_cast<size_t>(b)] > 0,
            "BlockAllocator: cannot register block {} (not in use)", b);
  Entry& e = entry_[static_cast<size_t>(b)];
  if (e.cached || by_hash_.count(hash)) return;
  e = Entry{true, hash, parent, std::move(tokens)};
  by_hash_[hash] = b;
}

PagedKVCache::PagedKVCache(const PagedCacheConfig& c) : cfg_(c) {
  TPU_CHECK(c.num_layers > 0 && c.kv_heads > 0 && c.head_dim > 0 && c.block_size > 0 && c.num_blocks > 0,
            "PagedKVCache: layers ({}), kv heads ({}), head_dim ({}), block_size ({}) and num_blocks ({}) must be "
            "positive",
            c.num_layers, c.kv_heads, c.head_dim, c.block_size, c.num_blocks);
  const auto per_layer = static_cast<size_t>(c.num_blocks * c.block_size * c.kv_heads * c.head_dim);
  const auto layers = static_cast<size_t>(c.num_layers);
  if (!c.quantized()) {
    k_.assign(layers, std::vector<float>(per_layer, 0.0f));
    if (!c.shared_kv) v_.assign(layers, std::vector<float>(per_layer, 0.0f));
    return;
  }
  const auto rows = static_cast<size_t>(c.num_blocks * c.block_size * c.kv_heads);
  kq_.assign(layers, std::vector<uint8_t>(per_layer, 0));
  ks_.assign(layers, std::vector<float>(rows, 1.0f));
  if (!c.shared_kv) {
    vq_.assign(layers, std::vector<uint8_t>(per_layer, 0));
    vs_.assign(layers, std::vector<float>(rows, 1.0f));
  }
  for (int b = 0; b < 256; ++b) f8_table_[b] = f8e4m3::from_bits(static_cast<uint8_t>(b)).to_f32();
}

int64_t PagedKVCache::bytes() const {
  return cfg_.num_blocks * cfg_.block_size * cfg_.bytes_per_token(static_cast<int64_t>(sizeof(float)));
}

void PagedKVCache::check_float(const char* what) const {
  TPU_CHECK(!cfg_.quantized(), "PagedKVCache: the {} cache has no float {} rows (write_key / read_key, key_dot)",
            nn::kv_cache_dtype_name(cfg_.kv_dtype), what);
}

void PagedKVCache::write_row(bool value, int64_t layer, int64_t block, int64_t offset, int64_t head, const float* x) {
  const auto l = static_cast<size_t>(layer);
  const int64_t d = cfg_.head_dim;
  if (!cfg_.quantized()) {
    std::copy_n(x, d, (value && !cfg_.shared_kv ? v_ : k_)[l].data() + index(block, offset, head));
    return;
  }
  const bool v = value && !cfg_.shared_kv;
  uint8_t* qr = (v ? vq_ : kq_)[l].data() + index(block, offset, head);
  // A row with a NaN or an infinity keeps a NaN scale (it reads back as NaN) and zero bytes.
  (v ? vs_ : ks_)[l][row(block, offset, head)] =
      kernels::kv_quantize_row(x, d, cfg_.kv_dtype == nn::KVCacheDType::fp8_e4m3, qr);
}

void PagedKVCache::read_row(bool value, int64_t layer, int64_t block, int64_t offset, int64_t head, float* out) const {
  const auto l = static_cast<size_t>(layer);
  const int64_t d = cfg_.head_dim;
  const bool v = value && !cfg_.shared_kv;
  if (!cfg_.quantized()) {
    std::copy_n((v ? v_ : k_)[l].data() + index(block, offset, head), d, out);
    return;
  }
  const uint8_t* qr = (v ? vq_ : kq_)[l].data() + index(block, offset, head);
  const float s = (v ? vs_ : ks_)[l][row(block, offset, head)];
  const bool fp8 = cfg_.kv_dtype == nn::KVCacheDType::fp8_e4m3;
  for (int64_t e = 0; e < d; ++e) out[e] = (fp8 ? f8_table_[qr[e]] : static_cast<float>(static_cast<int8_t>(qr[e]))) * s;
}

void PagedKVCache::write_key(int64_t layer, int64_t block, int64_t offset, int64_t head, const float* x) {
  write_row(false, layer, block, offset, head, x);
}
void PagedKVCache::write_value(int64_t layer, int64_t block, int64_t offset, int64_t head, const float* x) {
  write_row(true, layer, block, offset, head, x);
}
void PagedKVCache::read_key(int64_t layer, int64_t block, int64_t offset, int64_t head, float* out) const {
  read_row(false, layer, block, offset, head, out);
}
void PagedKVCache::read_value(int64_t layer, int64_t block, int64_t offset, int64_t head, float* out) const {
  read_row(true, layer, block, offset, head, out);
}

float PagedKVCache::key_dot(int64_t layer, int64_t block, int64_t offset, int64_t head, const float* q) const {
  const auto l = static_cast<size_t>(layer);
  const int64_t d = cfg_.head_dim;
  float dot = 0;
  if (!cfg_.quantized()) {
    const float* kr = k_[l].data() + index(block, offset, head);
    for (int64_t e = 0; e < d; ++e) dot += q[e] * kr[e];
    return dot;
  }
  kernels::kv_key_dots(kq_[l].data() + index(block, offset, head), cfg_.kv_dtype == nn::KVCacheDType::fp8_e4m3, d, q,
                       d, 1, &dot);
  return dot * ks_[l][row(block, offset, head)];
}

void PagedKVCache::value_axpy(int64_t layer, int64_t block, int64_t offset, int64_t head, float w, float* acc) const {
  const auto l = static_cast<size_t>(layer);
  const int64_t d = cfg_.head_dim;
  if (!cfg_.quantized()) {
    const float* vr = (cfg_.shared_kv ? k_ : v_)[l].data() + index(block, offset, head);
    for (int64_t e = 0; e < d; ++e) acc[e] += w * vr[e];
    return;
  }
  const bool sh = cfg_.shared_kv;
  const uint8_t* vr = (sh ? kq_ : vq_)[l].data() + index(block, offset, head);
  const float ws = w * (sh ? ks_ : vs_)[l][row(block, offset, head)];
  if (cfg_.kv_dtype == nn::KVCacheDType::fp8_e4m3) {
    for (int64_t e = 0; e < d; ++e) acc[e] += ws * f8_table_[vr[e]];
  } else {
    for (int64_t e = 0; e < d; ++e) acc[e] += ws * static_cast<float>(static_cast<int8_t>(vr[e]));
  }
}

void RaggedBatch::validate(const PagedCacheConfig& c) const {
  const int64_t s = num_seqs();
  TPU_CHECK(static_cast<int64_t>(query_start.size()) == s + 1 && static_cast<int64_t>(block_tables.size()) == s &&
                !query_start.empty() && query_start[0] == 0,
            "ragged_paged_attention: {} sequences need {} query offsets starting at 0 and {} block tables, got {} "
            "and {}",
            s, s + 1, s, query_start.size(), block_tables.size());
  for (int64_t i = 0; i < s; ++i) {
    const auto si = static_cast<size_t>(i);
    const int64_t q = query_start[si + 1] - query_start[si];
    TPU_CHECK(q >= 1 && context_len[si] >= q,
              "ragged_paged_attention: sequence {} has {} new tokens and a context of {} (need 1 <= new <= context)",
              i, q, context_len[si]);
    TPU_CHECK(block_tables[si] != nullptr &&
                  static_cast<int64_t>(block_tables[si]->size()) * c.block_size >= context_len[si],
              "ragged_paged_attention: the block table of sequence {} covers {} positions, its context is {}", i,
              block_tables[si] ? static_cast<int64_t>(block_tables[si]->size()) * c.block_size : 0, context_len[si]);
    for (int32_t b : *block_tables[si])  // -1: a block released behind a sliding window (never read)
      TPU_CHECK(b >= -1 && b < c.num_blocks, "ragged_paged_attention: sequence {} names block {} of {}", i, b,
                c.num_blocks);
  }
}

void ragged_paged_attention(PagedKVCache& cache, int64_t layer, const RaggedBatch& rb, const float* q, const float* k,
                            const float* v, float* out, int64_t num_heads, double scale, int64_t window,
                            double softcap) {
  const PagedCacheConfig& c = cache.config();
  TPU_CHECK(window >= 0 && softcap >= 0, "ragged_paged_attention: window {} and softcap {} must not be negative",
            window, softcap);
  TPU_CHECK(layer >= 0 && layer < c.num_layers, "ragged_paged_attention: layer {} of {}", layer, c.num_layers);
  TPU_CHECK(num_heads > 0 && num_heads % c.kv_heads == 0,
            "ragged_paged_attention: {} query heads are not a multiple of {} kv heads", num_heads, c.kv_heads);
  rb.validate(c);
  const int64_t d = c.head_dim, hkv = c.kv_heads, group = num_heads / hkv, bs = c.block_size;
  // 1. Cache update: the new keys and values go to their slots through the block tables.
  for (int64_t s = 0; s < rb.num_seqs(); ++s) {
    const auto si = static_cast<size_t>(s);
    const int64_t t0 = rb.query_start[si], t1 = rb.query_start[si + 1];
    const int64_t first = rb.context_len[si] - (t1 - t0);
    const std::vector<int32_t>& table = *rb.block_tables[si];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = first + (t - t0);
      const int64_t blk = table[static_cast<size_t>(p / bs)], off = p % bs;
      for (int64_t h = 0; h < hkv; ++h) {
        cache.write_key(layer, blk, off, h, k + (t * hkv + h) * d);
        if (!c.shared_kv) cache.write_value(layer, blk, off, h, v + (t * hkv + h) * d);
      }
    }
  }
  // 2. Attention: one (token, query head) per work item; an online softmax over the token's
  // causal context, read block by block through the sequence's table.
  std::vector<int64_t> seq_of(static_cast<size_t>(rb.num_tokens()));
  for (int64_t s = 0; s < rb.num_seqs(); ++s)
    for (int64_t t = rb.query_start[static_cast<size_t>(s)]; t < rb.query_start[static_cast<size_t>(s) + 1]; ++t)
      seq_of[static_cast<size_t>(t)] = s;
  const float sc = static_cast<float>(scale), cap = static_cast<float>(softcap);
  parallel_for(0, rb.num_tokens() * num_heads, 16, [&](int64_t w0, int64_t w1) {
    std::vector<float> acc(static_cast<size_t>(d));
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t t = w / num_heads, h = w % num_heads, kh = h / group;
      const auto si = static_cast<size_t>(seq_of[static_cast<size_t>(t)]);
      const int64_t q_len = rb.query_start[si + 1] - rb.query_start[si];
      const int64_t pos = rb.context_len[si] - q_len + (t - rb.query_start[si]);  // this token's position
      const std::vector<int32_t>& table = *rb.block_tables[si];
      const float* qr = q + (t * num_heads + h) * d;
      float m = -INFINITY, l = 0;
      std::fill(acc.begin(), acc.end(), 0.0f);
      const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;  // first visible key
      for (int64_t j0 = lo / bs * bs; j0 <= pos; j0 += bs) {
        const int64_t blk = table[static_cast<size_t>(j0 / bs)];
        TPU_CHECK(blk >= 0, "ragged_paged_attention: token {} reads position {}, whose block was released (outside "
                  "the window {})", t, j0, window);
        const int64_t n = std::min(bs, pos + 1 - j0);
        for (int64_t o = std::max<int64_t>(0, lo - j0); o < n; ++o) {
          const float dot = cache.key_dot(layer, blk, o, kh, qr);
          const float sco = cap > 0 ? cap * std::tanh(dot * sc / cap) : dot * sc;
          const float weight = sco > m ? 1.0f : std::exp(sco - m);
          if (sco > m) {
            const float corr = std::exp(m - sco);  // 0 for the first key (m = -inf)
            for (float& a : acc) a *= corr;
            l *= corr;
            m = sco;
          }
          cache.value_axpy(layer, blk, o, kh, weight, acc.data());
          l += weight;
        }
      }
      float* orow = out + (t * num_heads + h) * d;
      for (int64_t e = 0; e < d; ++e) orow[e] = acc[static_cast<size_t>(e)] / l;
    }
  });
}

}  // namespace tpu::serve
