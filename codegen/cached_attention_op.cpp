// The kv_cache_attention op (cached_attention.h): checks, the cpu kernel (attention over the
// narrowed cache) and the chip kernel (one program for every position; the narrowed path for
// shapes it does not take).
#include <cmath>

#include <fmt/format.h>

#include "codegen/cache_update.h"
#include "codegen/cached_attention.h"
#include "codegen/launch.h"
#include "codegen/precision.h"
#include "ops/meta_util.h"
#include "ops/precision_scope.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu::codegen {
namespace {

using namespace ops;
constexpr const char* kOp = "kv_cache_attention";

void meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& q = a.inputs[0];
  const Tensor& k = a.inputs[1];
  const Tensor& v = a.inputs[2];
  const Tensor& p = a.inputs[3];
  TPU_CHECK(q.dim() == 4 && k.dim() == 4 && v.shape() == k.shape() && k.size(0) == q.size(0) && k.size(1) > 0 &&
                q.size(1) % k.size(1) == 0 && k.size(3) == q.size(3) && q.size(2) >= 1 && q.size(2) <= k.size(2),
            "{}: expected q [B, H, T, D] and caches [B, Hkv, C, D] with H a multiple of Hkv and 1 <= T <= C, got q {}, "
            "k {}, v {}",
            kOp, q.shape().str(), k.shape().str(), v.shape().str());
  TPU_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype() && is_floating(q.dtype()),
            "{}: q, k and v must share one floating dtype, got {}, {} and {}", kOp, dtype_name(q.dtype()),
            dtype_name(k.dtype()), dtype_name(v.dtype()));
  TPU_CHECK(p.numel() == 1 && (p.dtype() == DType::i32 || p.dtype() == DType::i64) && p.device() == q.device(),
            "{}: the position must be one i32 or i64 value on {}, got {}", kOp, q.device().str(), describe(p));
  TPU_CHECK(a.attrs.get_float("scale") > 0, "{}: scale must be positive, got {}", kOp, a.attrs.get_float("scale"));
  TPU_CHECK(a.attrs.get_int("window") >= 0 && a.attrs.get_float("softcap") >= 0 &&
                std::isfinite(a.attrs.get_float("softcap")),
            "{}: window ({}) and softcap ({}) must not be negative", kOp, a.attrs.get_int("window"),
            a.attrs.get_float("softcap"));
  if (a.attrs.get_bool("has_mask")) {
    const Tensor& mk = a.inputs[4];
    const Shape want{q.size(0), q.size(1), q.size(2), k.size(2)};
    bool ok = mk.dtype() == DType::boolean && mk.dim() <= 4 && mk.device() == q.device();
    for (int i = 0; ok && i < mk.dim(); ++i) {
      const int64_t s = mk.size(i), w = want[size_t(4 - mk.dim() + i)];
      ok = s == 1 || s == w;
    }
    TPU_CHECK(ok, "{}: the mask must be bool on {} and broadcast to {}, got {}", kOp, q.device().str(), want.str(),
              describe(mk));
  }
  m.out() = {q.shape(), q.dtype(), q.device()};
}

// The attention over the live keys [0, pos + T) as scaled_dot_product_attention; with a sliding
// window the band of query i (keys (len - T + i - window, len - T + i]) joins the mask, and with
// soft-capping the scores are computed, capped and masked as their own ops.
Tensor narrowed(const KernelArgs& a, int64_t len) {
  const Tensor& q = a.inputs[0];
  const int64_t window = a.attrs.get_int("window"), t = q.size(2);
  const double softcap = a.attrs.get_float("softcap"), scale = a.attrs.get_float("scale");
  Tensor mask;
  if (a.attrs.get_bool("has_mask")) {
    mask = a.inputs[4];
    if (mask.dim() > 0 && mask.size(-1) > 1) mask = narrow(mask, mask.dim() - 1, 0, len);  // else broadcast
  }
  if (window > 0) {
    std::vector<bool> band(static_cast<size_t>(t * len));
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < len; ++j) band[static_cast<size_t>(i * len + j)] = j > len - t + i - window;
    const Tensor b = from_vector(band, Shape{1, 1, t, len}, TensorOptions(DType::boolean, q.device()));
    mask = mask.defined() ? logical_and(mask, b) : b;
  }
  const Tensor k = narrow(a.inputs[1], 2, 0, len), v = narrow(a.inputs[2], 2, 0, len);
  if (softcap == 0) return scaled_dot_product_attention(q, k, v, mask, false, scale);
  const int64_t b = q.size(0), h = q.size(1), hk = k.size(1), d = q.size(3);
  auto repeat = [&](const Tensor& y) {  // each key/value head serves h / hk query heads
    return hk == h ? y : reshape(expand(unsqueeze(y, 2), Shape{b, hk, h / hk, len, d}), Shape{b, h, len, d});
  };
  Tensor scores = mul(tanh(mul(matmul(q, transpose(repeat(k), -1, -2)), scale / softcap)), softcap);
  if (mask.defined()) scores = masked_fill(scores, logical_not(mask), -INFINITY);
  return matmul(softmax(scores, -1), repeat(v));
}

int64_t live_length(const KernelArgs& a) {
  const int64_t t = a.inputs[0].size(2), c = a.inputs[1].size(2);
  return read_cache_position(a.inputs[3], c - t, kOp) + t;
}

void cached_attention_cpu(const KernelArgs& a) { a.outputs[0] = narrowed(a, live_length(a)); }

void cached_attention_chip(const KernelArgs& a) {
  const int64_t len = live_length(a);
  Tensor q = a.inputs[0];
  const Tensor& k = a.inputs[1];
  const Tensor& v = a.inputs[2];
  const Tensor& out = a.outputs[0];
  const Device dev = out.device();
  const DType dt = q.dtype();
  const int64_t B = q.size(0), H = q.size(1), Hkv = k.size(1), C = k.size(2), D = q.size(3);
  bool fits = runs_generated_programs(dev) && q.size(2) == 1 && (dt == DType::f32 || dt == DType::bf16) &&
              k.is_contiguous() && v.is_contiguous() && out.is_contiguous();
  Tensor mask;
  CachedAttentionSpec s;
  if (fits && a.attrs.get_bool("has_mask")) {
    // One mask row per batch row, the same for every head, keys contiguous.
    mask = a.inputs[4].expand(Shape{B, H, 1, C});
    fits = mask.strides()[1] == 0 && (mask.strides()[3] == 1 || C == 1);
    s.has_mask = true;
    s.mask_batch_stride = mask.strides()[0];
  }
  // Under emulate_precision_casts the attention over the live keys is eager's own
  // (scaled_dot_product_attention over the narrowed cache): the one-program kernel's online
  // softmax steps through the keys in other blocks, so its sums round differently.
  if (ops::emulating_precision_casts()) fits = false;
  if (!fits) {  // the attention kernel over the narrowed cache (a program per length)
    const int64_t window = a.attrs.get_int("window"), t = q.size(2);
    const double softcap = a.attrs.get_float("softcap");
    if ((window > 0 || softcap > 0) && runs_generated_programs(dev) && !ops::emulating_precision_casts() &&
        out.is_contiguous()) {
      // The window and soft-cap as constants of the flash program (query i at key position len - T + i).
      Tensor m;
      if (a.attrs.get_bool("has_mask")) {
        m = a.inputs[4];
        if (m.dim() > 0 && m.size(-1) > 1) m = narrow(m, m.dim() - 1, 0, len);
      }
      if (flash_attention_on_chip(q, narrow(k, 2, 0, len), narrow(v, 2, 0, len), m, out, a.attrs.get_float("scale"),
                                  false, window, len - t, softcap))
        return;
    }
    a.outputs[0] = narrowed(a, len);
    return;
  }
  if (!q.is_contiguous()) q = contiguous(q);
  s.batch = B, s.heads = H, s.kv_heads = Hkv, s.head_dim = D, s.capacity = C;
  s.scale = float(a.attrs.get_float("scale"));
  s.window = a.attrs.get_int("window");
  s.softcap = float(a.attrs.get_float("softcap"));
  s.dtype = dt == DType::bf16 ? sim::DType::bf16 : sim::DType::f32;
  s.mode = dt == DType::bf16 ? sim::MxuMode::bf16 : f32_matmul_mode();
  const sim::ChipConfig& cfg = chip_config(dev);
  s.tk = choose_cached_attention_tk(cfg, s);
  const LoadedProgram lp = cached_program(dev, cached_attention_key(s), [&] { return make_cached_attention_program(cfg, s); });
  const int64_t steps = (len + s.tk - 1) / s.tk;
  launch(dev, lp, kOp,
         {hbm_address(q), hbm_address(k), hbm_address(v), hbm_address(out), s.has_mask ? hbm_address(mask) : hbm_address(q),
          steps, hbm_address(a.inputs[3])});
}

TPU_DEFINE_OP(cached_attention_op,
              {.name = "kv_cache_attention", .num_inputs = 5, .flags = kNonDifferentiable, .meta = &meta,
               .cpu = &cached_attention_cpu,
               .doc = "decode attention over the live keys [0, pos + T) of a [B, Hkv, C, D] KV cache"});

[[maybe_unused]] const bool g_registered = [] {
  cached_attention_op();
  ops::register_kernel(kOp, DeviceType::sim, &cached_attention_chip);
  ops::register_kernel(kOp, DeviceType::tpu, &cached_attention_chip);
  return true;
}();

}  // namespace

Tensor kv_cache_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                          const Tensor& mask, double scale, int64_t window, double softcap) {
  TPU_CHECK(q.defined() && k_cache.defined() && v_cache.defined() && pos.defined(),
            "{}: q, the caches and the position must be defined tensors", kOp);
  const bool hm = mask.defined();
  return ops::call(cached_attention_op(), {q, k_cache, v_cache, pos, hm ? mask : q},
                   {{"scale", scale}, {"has_mask", hm}, {"window", window}, {"softcap", softcap}});
}

}  // namespace tpu::codegen
