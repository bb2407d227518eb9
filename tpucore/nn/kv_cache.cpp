// The contiguous key/value cache of generation (nn::KVCache) and attention without a cache.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "ops/cpu/kernels/kv_rows.h"
#include "ops/cpu/vec_math.h"
#include "tpucore/core/parallel.h"

#include "codegen/cache_update.h"
#include "codegen/cached_attention.h"
#include "tpucore/autograd.h"
#include "tpucore/nn/transformer.h"

namespace tpu::nn {

Tensor dense_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep, double scale) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  // Top-left aligned causal (no cached positions) unless a mask is given.
  const Tensor attn = scaled_dot_product_attention(q, k, v, keep, !keep.defined(), scale);
  return reshape(transpose(attn, 1, 2), Shape{b, t, h * d});
}

Tensor masked_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep, double scale,
                        double softcap) {
  TPU_CHECK(keep.defined() && keep.dtype() == DType::boolean, "masked_attention: needs a bool keep mask");
  if (softcap == 0) return scaled_dot_product_attention(q, k, v, keep, false, scale);
  TPU_CHECK(softcap > 0 && std::isfinite(softcap), "attention: attn_logit_softcapping must be positive, got {}", softcap);
  const int64_t b = q.size(0), h = q.size(1), hk = k.size(1), s = k.size(2), d = q.size(3);
  TPU_CHECK(hk > 0 && h % hk == 0, "masked_attention: {} query heads over {} key/value heads", h, hk);
  Tensor kk = k, vv = v;
  if (hk != h) {  // each key/value head serves h / hk query heads
    auto repeat = [&](const Tensor& y) {
      return reshape(expand(unsqueeze(y, 2), Shape{b, hk, h / hk, s, d}), Shape{b, h, s, d});
    };
    kk = repeat(k);
    vv = repeat(v);
  }
  Tensor scores = mul(matmul(q, transpose(kk, -1, -2)), scale);
  scores = mul(tanh(div(scores, softcap)), softcap);
  scores = masked_fill(scores, logical_not(keep), -INFINITY);
  return matmul(softmax(scores, -1), vv);
}

Tensor sliding_window_keep(int64_t t, int64_t past, int64_t window, Device device) {
  TPU_CHECK(window > 0 && t > 0 && past >= 0, "sliding_window_keep: window {} for {} tokens after {}", window, t, past);
  const int64_t s = past + t;
  std::vector<bool> keep(static_cast<size_t>(t * s), false);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = std::max<int64_t>(0, past + i - window + 1); j < s; ++j) keep[static_cast<size_t>(i * s + j)] = true;
  NoGradGuard ng;
  return from_vector(keep, Shape{1, 1, t, s}, TensorOptions(DType::boolean, device));
}

Tensor dense_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep, double scale,
                       const AttentionVariant& variant) {
  if (variant.plain()) return dense_attention(q, k, v, keep, scale);
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  Tensor mask = keep.defined() ? keep : causal_keep_mask(1, t, 0, {}, q.device());
  if (variant.window > 0) mask = logical_and(mask, sliding_window_keep(t, 0, variant.window, q.device()));
  const Tensor attn = masked_attention(q, k, v, mask, scale, variant.softcap);
  return reshape(transpose(attn, 1, 2), Shape{b, t, h * d});
}

Tensor AttentionCache::update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& keep, double scale, const AttentionVariant& variant) {
  TPU_CHECK(variant.window == 0,
            "attention: this attention cache does not implement sliding_window attention (window {}); the "
            "contiguous KV cache and the serving engine's paged caches do",
            variant.window);
  TPU_CHECK(variant.softcap == 0,
            "attention: this attention cache does not implement attn_logit_softcapping ({}); the contiguous KV cache "
            "and the serving engine's paged caches do",
            variant.softcap);
  return update_and_attend(layer, q, k, v, keep, scale);
}

KVCache::KVCache(int64_t layers, int64_t b, int64_t h, int64_t cap, int64_t d, DType dtype, Device device,
                 std::vector<int64_t> rings)
    : batch_(b), heads_(h), capacity_(cap), head_dim_(d), rings_(std::move(rings)) {
  TPU_CHECK(layers > 0 && b > 0 && h > 0 && cap > 0 && d > 0,
            "KVCache: layers ({}), batch ({}), kv heads ({}), capacity ({}) and head_dim ({}) must be positive", layers,
            b, h, cap, d);
  const bool quant = dtype == DType::i8 || dtype == DType::f8e4m3;
  TPU_CHECK((is_floating(dtype) && !is_float8(dtype)) || quant,
            "KVCache: dtype {} is not supported (f32, bf16 or f16, or i8 / f8e4m3 for the quantized cache)",
            dtype_name(dtype));
  TPU_CHECK(rings_.empty() || (static_cast<int64_t>(rings_.size()) == layers && !quant),
            "KVCache: sliding-window rings need one size per layer ({} given for {}) and a float cache (not {})",
            rings_.size(), layers, dtype_name(dtype));
  all_ring_ = !rings_.empty();
  for (int64_t r : rings_) {
    TPU_CHECK(r >= 0, "KVCache: a ring of {} positions", r);
    all_ring_ = all_ring_ && r == cap;
  }
  NoGradGuard ng;
  for (int64_t i = 0; i < layers; ++i) {
    const int64_t n = ring_size(i) > 0 ? ring_size(i) : cap;
    k_.push_back(zeros(Shape{b, h, n, d}, TensorOptions(dtype, device)));
    v_.push_back(zeros(Shape{b, h, n, d}, TensorOptions(dtype, device)));
    if (quant) {
      k_scale_.push_back(ones(Shape{b, h, cap, 1}, TensorOptions(DType::f32, device)));
      v_scale_.push_back(ones(Shape{b, h, cap, 1}, TensorOptions(DType::f32, device)));
    }
  }
}

int64_t KVCache::nbytes() const {
  int64_t n = 0;
  for (const auto* list : {&k_, &v_, &k_scale_, &v_scale_})
    for (const Tensor& t : *list) n += t.numel() * static_cast<int64_t>(dtype_size(t.dtype()));
  return n;
}

namespace {

// x [..., D] as int8 (or e4m3) q and f32 scales [..., 1]: scale = max |x| / 127 (e4m3: / 448;
// 1 for a zero vector), q = round-half-even(x / scale) (e4m3: x / scale rounded to e4m3).
std::pair<Tensor, Tensor> kv_quantize_rows(const Tensor& x, DType store) {
  const Tensor xf = to(x, DType::f32);
  const Tensor amax = tpu::amax(abs(xf), {-1}, true);
  const double qmax = store == DType::f8e4m3 ? 448.0 : 127.0;
  const Tensor scale = where(gt(amax, 0.0), div(amax, qmax), ones_like(amax));
  const Tensor y = clamp(div(xf, scale), Scalar(-qmax), Scalar(qmax));
  const Tensor q = store == DType::f8e4m3 ? to(y, DType::f8e4m3) : to(round(y), DType::i8);
  return {q, scale};
}

}  // namespace

const char* kv_cache_dtype_name(KVCacheDType t) {
  switch (t) {
    case KVCacheDType::int8: return "int8";
    case KVCacheDType::fp8_e4m3: return "fp8_e4m3";
    case KVCacheDType::auto_dtype: break;
  }
  return "auto";
}

KVCacheDType parse_kv_cache_dtype(const std::string& name) {
  if (name == "auto") return KVCacheDType::auto_dtype;
  if (name == "int8") return KVCacheDType::int8;
  if (name == "fp8_e4m3" || name == "fp8" || name == "fp8_e4m3fn") return KVCacheDType::fp8_e4m3;
  fail("kv cache dtype '{}' is not supported (auto, int8 or fp8_e4m3)", name);
}

DType kv_cache_storage_dtype(KVCacheDType t, DType fallback) {
  if (t == KVCacheDType::int8) return DType::i8;
  if (t == KVCacheDType::fp8_e4m3) return DType::f8e4m3;
  return fallback;
}

void KVCache::check_rows(int64_t layer, const Tensor& k, const Tensor& v) const {
  TPU_CHECK(layer >= 0 && layer < num_layers(), "KVCache: layer {} out of range (the cache has {} layers)", layer,
            num_layers());
  TPU_CHECK(k.defined() && v.defined() && k.dim() == 4 && k.shape() == v.shape() && k.size(0) == batch_ &&
                k.size(1) == heads_ && k.size(3) == head_dim_,
            "KVCache: expected keys and values [{}, {}, T, {}], got {} and {}", batch_, heads_, head_dim_,
            k.defined() ? k.shape().str() : "undefined", v.defined() ? v.shape().str() : "undefined");
}

void KVCache::check_room(int64_t t) const {
  TPU_CHECK(length_ + t <= capacity_, "KVCache: {} new positions after {} cached exceed the capacity {}", t, length_,
            capacity_);
}

std::pair<Tensor, Tensor> KVCache::update(int64_t layer, const Tensor& k, const Tensor& v) {
  check_rows(layer, k, v);
  const int64_t t = k.size(2);
  TPU_CHECK(ring_size(layer) == 0 || (all_ring_ && write_pos_.defined()),
            "KVCache: the sliding-window ring stores keys through update_and_attend_variant() or a write position");
  TPU_CHECK(!quantized() || (!write_pos_.defined() && !write_mask_.defined()),
            "KVCache: the quantized {} cache does not implement shape-static steps (write mask or write position); "
            "decode without compile, or use an f32 / bf16 cache",
            k_.front().dtype() == DType::i8 ? "int8" : "fp8_e4m3");
  if (write_pos_.defined()) {
    NoGradGuard ng;
    return {codegen::kv_cache_write_(k_[static_cast<size_t>(layer)], k, write_pos_),
            codegen::kv_cache_write_(v_[static_cast<size_t>(layer)], v, write_pos_)};
  }
  if (write_mask_.defined()) {
    TPU_CHECK(t == 1 && write_mask_.shape() == Shape({1, 1, capacity_, 1}) && write_mask_.dtype() == DType::boolean,
              "KVCache: a write mask must be bool [1, 1, {}, 1] and the step one position, got mask {} for {} positions",
              capacity_, write_mask_.shape().str(), t);
    Tensor& kb = k_[static_cast<size_t>(layer)];
    Tensor& vb = v_[static_cast<size_t>(layer)];
    copy_(kb, where(write_mask_, k, kb));
    copy_(vb, where(write_mask_, v, vb));
    return {kb, vb};
  }
  check_room(t);
  NoGradGuard ng;
  if (quantized()) {
    const size_t l = static_cast<size_t>(layer);
    store_quantized(layer, k, v);
    const int64_t n = length_ + t;
    auto deq = [&](const Tensor& q, const Tensor& sc) {
      return to(mul(to(narrow(q, 2, 0, n), DType::f32), narrow(sc, 2, 0, n)), k.dtype());
    };
    return {deq(k_[l], k_scale_[l]), deq(v_[l], v_scale_[l])};
  }
  Tensor kd = narrow(k_[static_cast<size_t>(layer)], 2, length_, t);
  Tensor vd = narrow(v_[static_cast<size_t>(layer)], 2, length_, t);
  copy_(kd, k);
  copy_(vd, v);
  return {narrow(k_[static_cast<size_t>(layer)], 2, 0, length_ + t), narrow(v_[static_cast<size_t>(layer)], 2, 0, length_ + t)};
}

void KVCache::store_quantized(int64_t layer, const Tensor& k, const Tensor& v) {
  const size_t l = static_cast<size_t>(layer);
  const int64_t t = k.size(2);
  if (k_[l].device().type == DeviceType::cpu && !k.is_proxy() && !v.is_proxy()) {
    // On the cpu each new row is quantized straight into the cache (ops/cpu/kernels/kv_rows.h:
    // the same rule as below, except that a row with a NaN or an infinity gets a NaN scale).
    const bool fp8 = k_[l].dtype() == DType::f8e4m3;
    const int64_t d = head_dim_;
    for (auto [x, store, scales] : {std::tuple{&k, &k_[l], &k_scale_[l]}, std::tuple{&v, &v_[l], &v_scale_[l]}}) {
      const Tensor xf = to(*x, DType::f32).contiguous();
      const float* xp = xf.data<float>();
      auto* qp = static_cast<uint8_t*>(store->raw_data());
      float* sp = scales->data<float>();
      for (int64_t r = 0; r < batch_ * heads_; ++r)
        for (int64_t i = 0; i < t; ++i) {
          const int64_t slot = r * capacity_ + length_ + i;
          sp[slot] = kernels::kv_quantize_row(xp + (r * t + i) * d, d, fp8, qp + slot * d);
        }
    }
    return;
  }
  const auto [kq, ks] = kv_quantize_rows(k, k_[l].dtype());
  const auto [vq, vs] = kv_quantize_rows(v, v_[l].dtype());
  narrow(k_[l], 2, length_, t).copy_(kq);
  narrow(k_scale_[l], 2, length_, t).copy_(ks);
  narrow(v_[l], 2, length_, t).copy_(vq);
  narrow(v_scale_[l], 2, length_, t).copy_(vs);
}

void KVCache::advance(int64_t t) {
  TPU_CHECK(t >= 0 && (all_ring_ || length_ + t <= capacity_), "KVCache: cannot advance by {} from {} (capacity {})", t, length_,
            capacity_);
  length_ += t;
}

Tensor KVCache::update_and_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                                  double scale) {
  TPU_CHECK(layer < 0 || layer >= num_layers() || ring_size(layer) == 0,
            "KVCache: the sliding-window ring of layer {} serves a windowed layer only (a layer without a window)", layer);
  if (Tensor o = quantized_attend(layer, q, k, v, keep, scale, {}); o.defined()) return o;
  const int64_t past = length_, b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  const auto [kc, vc] = update(layer, k, v);
  Tensor attn;
  if (t == 1 && write_pos_.defined()) {
    // A shape-static decode step (the position a runtime tensor): attention over the live keys
    // [0, position + 1) only, however large the cache (codegen/cached_attention.h).
    attn = codegen::kv_cache_attention(q, kc, vc, write_pos_, keep, scale);
  } else {
    Tensor mask = keep;
    bool causal = false;
    if (!mask.defined()) {
      if (past == 0) causal = true;  // top-left aligned causal equals ours without a past
      else mask = causal_keep_mask(b, t, past, {}, q.device());
    }
    attn = scaled_dot_product_attention(q, kc, vc, mask, causal, scale);
  }
  return reshape(transpose(attn, 1, 2), Shape{b, t, h * d});
}

}  // namespace tpu::nn

namespace tpu::nn {

Tensor KVCache::update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& keep, double scale, const AttentionVariant& variant) {
  // Before any path (ring, in-place quantized, general) so that each rejects the same way and
  // nothing is written.
  TPU_CHECK(variant.softcap >= 0 && std::isfinite(variant.softcap) && variant.window >= 0,
            "attention: softcap {} and window {} must be finite and not negative", variant.softcap, variant.window);
  if (layer >= 0 && layer < num_layers() && ring_size(layer) > 0) return ring_attend(layer, q, k, v, keep, scale, variant);
  if (variant.plain()) return update_and_attend(layer, q, k, v, keep, scale);
  TPU_CHECK(!write_mask_.defined() || write_pos_.defined(),
            "KVCache: a write-mask step does not implement sliding_window or attn_logit_softcapping "
            "(set a write position instead)");
  if (Tensor o = quantized_attend(layer, q, k, v, keep, scale, variant); o.defined()) return o;
  const int64_t past = length_, b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  const auto [kc, vc] = update(layer, k, v);
  Tensor attn;
  if (t == 1 && write_pos_.defined()) {
    // Shape-static: the live keys of the whole capacity up to the runtime position, the window
    // and soft-cap inside the kernel (on a chip: constants of its program, no host mask).
    attn = codegen::kv_cache_attention(q, kc, vc, write_pos_, keep, scale, variant.window, variant.softcap);
  } else {
    Tensor mask = keep;
    if (!mask.defined()) mask = causal_keep_mask(b, t, past, {}, q.device());
    if (q.device().type != DeviceType::cpu && !quantized()) {
      // On a chip the window and soft-cap are constants of the fused attention program (the
      // cached keys as a cache of length past + t written at past).
      attn = codegen::kv_cache_attention(q, kc, vc, codegen::position_tensor(past, q.device()), mask, scale,
                                         variant.window, variant.softcap);
    } else {
      if (variant.window > 0) mask = logical_and(mask, sliding_window_keep(t, past, variant.window, q.device()));
      attn = masked_attention(q, kc, vc, mask, scale, variant.softcap);
    }
  }
  return reshape(transpose(attn, 1, 2), Shape{b, t, h * d});
}

Tensor KVCache::ring_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                           double scale, const AttentionVariant& variant) {
  const int64_t w = ring_size(layer);
  TPU_CHECK(variant.window == w, "KVCache: the sliding-window ring of layer {} holds {} positions, the layer's window is {}",
            layer, w, variant.window);
  TPU_CHECK(all_ring_ || !write_pos_.defined(),
            "KVCache: a shape-static step needs every layer a ring of the cache's capacity (layer {} rings {} of {})",
            layer, w, capacity_);
  TPU_CHECK(!write_mask_.defined() || write_pos_.defined(),
            "KVCache: the sliding-window ring does not implement a write-mask step (set a write position instead)");
  const int64_t past = length_, b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  Tensor attn;
  if (write_pos_.defined()) {
    // Shape-static: the step's key goes to slot (write position); the ring then holds exactly
    // the window, the mask hides the slots not yet written and the padding.
    TPU_CHECK(t == 1 && keep.defined() && keep.shape() == Shape({b, 1, 1, w}),
              "KVCache: a shape-static ring step takes one token and a keep mask [{}, 1, 1, {}]", b, w);
    const auto [kc, vc] = update(layer, k, v);
    attn = masked_attention(q, kc, vc, keep, scale, variant.softcap);
  } else {
    NoGradGuard ng;
    const auto l = static_cast<size_t>(layer);
    TPU_CHECK(layer >= 0 && layer < num_layers(), "KVCache: layer {} out of range (the cache has {} layers)", layer,
              num_layers());
    TPU_CHECK(k.dim() == 4 && k.shape() == v.shape() && k.size(0) == batch_ && k.size(1) == heads_ &&
                  k.size(3) == head_dim_,
              "KVCache: expected keys and values [{}, {}, T, {}], got {}", batch_, heads_, head_dim_, k.shape().str());
    // The cached window in position order (position p in slot p % w), then the new keys.
    const int64_t kept = std::min(past, w), first = (past - kept) % w;
    auto window_of = [&](const Tensor& store, const Tensor& fresh) {
      std::vector<Tensor> parts;
      const int64_t n1 = std::min(kept, w - first);
      if (n1 > 0) parts.push_back(narrow(store, 2, first, n1));
      if (kept > n1) parts.push_back(narrow(store, 2, 0, kept - n1));
      parts.push_back(fresh);
      return cat(parts, 2);
    };
    const Tensor kc = window_of(k_[l], k), vc = window_of(v_[l], v);
    Tensor mask;
    if (keep.defined()) {
      TPU_CHECK(keep.dim() == 4 && keep.size(2) == t && keep.size(3) == past + t,
                "KVCache: a keep mask must be [B, 1, {}, {}] (every position seen), got {}", t, past + t,
                keep.shape().str());
      mask = narrow(keep, 3, past - kept, kept + t);
    } else {
      mask = causal_keep_mask(b, t, kept, {}, q.device());
    }
    if (q.device().type != DeviceType::cpu) {  // the window and soft-cap as program constants (as above)
      attn = codegen::kv_cache_attention(q, kc, vc, codegen::position_tensor(kept, q.device()), mask, scale, w,
                                         variant.softcap);
    } else {
      mask = logical_and(mask, sliding_window_keep(t, kept, w, q.device()));
      attn = masked_attention(q, kc, vc, mask, scale, variant.softcap);
    }
    // Only the last w new positions stay.
    const int64_t m = std::min(t, w), slot = (past + t - m) % w, n1 = std::min(m, w - slot);
    for (auto [store, fresh] : {std::pair<Tensor*, const Tensor*>{&k_[l], &k}, {&v_[l], &v}}) {
      narrow(*store, 2, slot, n1).copy_(narrow(*fresh, 2, t - m, n1));
      if (m > n1) narrow(*store, 2, 0, m - n1).copy_(narrow(*fresh, 2, t - m + n1, m - n1));
    }
  }
  return reshape(transpose(attn, 1, 2), Shape{b, t, h * d});
}

// Attention over a quantized cache on the cpu, reading its int8 / e4m3 rows in place (no float
// copy of the cache): per (row, kv head, new position), each cached key row is widened once and
// dotted with every query head of its group, the scores (scaled, soft-capped, masked) go through
// a softmax, and each value row is widened once and added with its weight times its scale.
// Undefined when this does not apply (a chip, a trace, a mask of another shape, a query that
// needs its gradient): the caller then takes the general path.
Tensor KVCache::quantized_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                                 double scale, const AttentionVariant& variant) {
  if (!quantized() || layer < 0 || layer >= num_layers() || q.device().type != DeviceType::cpu || q.is_proxy() ||
      k.is_proxy() || v.is_proxy() || (keep.defined() && keep.is_proxy()) || write_pos_.defined() ||
      write_mask_.defined() || (is_grad_enabled() && q.requires_grad()) || q.dim() != 4 || !k.defined() ||
      k.dim() != 4 || q.size(0) != batch_ ||
      q.size(2) != k.size(2) || q.size(3) != head_dim_ || q.size(1) % heads_ != 0)
    return {};
  const int64_t past = length_, b = batch_, h = q.size(1), t = q.size(2), d = head_dim_, hk = heads_;
  const int64_t n = past + t, group = h / hk;
  if (keep.defined() && (keep.dtype() != DType::boolean || keep.dim() != 4 || (keep.size(0) != 1 && keep.size(0) != b) ||
                         keep.size(1) != 1 || keep.size(2) != t || keep.size(3) != n))
    return {};
  check_rows(layer, k, v);  // update()'s checks, then the new rows go in quantized
  check_room(t);
  NoGradGuard ng;
  store_quantized(layer, k, v);
  const auto l = static_cast<size_t>(layer);
  const Tensor qf = to(q, DType::f32).contiguous();
  const Tensor keepc = keep.defined() ? keep.contiguous() : Tensor();
  const float* qp = qf.data<float>();
  const bool* mp = keepc.defined() ? keepc.data<bool>() : nullptr;
  const int64_t m_bs = keepc.defined() && keepc.size(0) == b ? t * n : 0;
  const auto* kp = static_cast<const uint8_t*>(k_[l].raw_data());
  const auto* vp = static_cast<const uint8_t*>(v_[l].raw_data());
  const float* ksp = k_scale_[l].data<float>();
  const float* vsp = v_scale_[l].data<float>();
  const bool fp8 = k_[l].dtype() == DType::f8e4m3;
  const float sc = static_cast<float>(scale), cap = static_cast<float>(variant.softcap);
  const int64_t window = variant.window;
  const ops::cpu::VecUnaryFn exp_fn = ops::cpu::vec_math().get(ops::cpu::VecUnary::exp);
  std::vector<float> out(static_cast<size_t>(b * t * h * d));
  parallel_for(0, b * hk * t, 1, [&](int64_t w0, int64_t w1) {
    // s: the scores of the group's query heads [position][head]; wgt: their softmax weights over
    // the visible positions idx [visible position][head].
    std::vector<float> s(static_cast<size_t>(group * n)), wgt(static_cast<size_t>(group * n));
    std::vector<int64_t> idx(static_cast<size_t>(n));
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t i = w % t, kh = (w / t) % hk, bi = w / (t * hk);
      const int64_t pos = past + i, lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      const bool* mrow = mp != nullptr ? mp + bi * m_bs + i * n : nullptr;
      auto visible = [&](int64_t j) { return j >= lo && (mrow != nullptr ? mrow[j] : j <= pos); };
      const int64_t hi = mrow != nullptr ? n : pos + 1;  // one past the last position that may be visible
      const int64_t cache_row = (bi * hk + kh) * capacity_;
      const float* q0 = qp + ((bi * h + kh * group) * t + i) * d;  // the group's query rows, t * d apart
      float* o0 = out.data() + ((bi * t + i) * h + kh * group) * d;  // its output rows, d apart
      // Scores of the group's query heads against every visible key.
      for (int64_t j = lo; j < hi; ++j) {
        if (!visible(j)) continue;
        float* sj = s.data() + j * group;
        kernels::kv_key_dots(kp + (cache_row + j) * d, fp8, d, q0, t * d, group, sj);
        const float f = ksp[cache_row + j] * sc;
        for (int64_t g = 0; g < group; ++g) {
          const float x = sj[g] * f;
          sj[g] = cap > 0 ? cap * std::tanh(x / cap) : x;
        }
      }
      // Softmax per head over the visible positions, packed in order (idx), each weight times its
      // value row's scale; nothing visible: NaN, as softmax over -inf.
      int64_t count = 0;
      for (int64_t j = lo; j < hi; ++j)
        if (visible(j)) idx[static_cast<size_t>(count++)] = j;
      for (int64_t g = 0; g < group; ++g) {
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < count; ++c) {
          const float x = s[static_cast<size_t>(idx[static_cast<size_t>(c)] * group + g)];
          row[static_cast<size_t>(c)] = x;
          mx = std::max(mx, x);
        }
        for (int64_t c = 0; c < count; ++c) row[static_cast<size_t>(c)] -= mx;
        exp_fn(row.data(), row.data(), count);
        double sum = 0;
        for (int64_t c = 0; c < count; ++c) sum += row[static_cast<size_t>(c)];
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t c = 0; c < count; ++c)
          wgt[static_cast<size_t>(c * group + g)] =
              row[static_cast<size_t>(c)] * inv * vsp[cache_row + idx[static_cast<size_t>(c)]];
      }
      kernels::kv_weighted_values(vp + cache_row * d, fp8, d, idx.data(), count, wgt.data(), group, o0, d);
      if (count == 0)
        for (int64_t g = 0; g < group; ++g) std::fill_n(o0 + g * d, d, std::numeric_limits<float>::quiet_NaN());
    }
  });
  return to(from_vector(out, Shape{b, t, h * d}), q.dtype());
}

}  // namespace tpu::nn
