// Symmetric weight quantization (int8 per output channel, packed int4 per group of columns), the
// inverses, and the linear layers that read quantized weights in place: the registry ops behind
// tpucore/quantize.h (whose functions, in tpucore/quant/quantize.cpp, call them by name).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "ops/cpu/kernels/gemv_int4.h"
#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/gemv_int8.h"
#include "ops/int4_repack.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/core/float8.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

bool float_input(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// The outputs of a per-output-channel quantizer of a 2-D float weight: q [N, K] of `qtype` and
// one f32 scale per row.
void per_channel_quantize_meta(const char* op, DType qtype, const MetaArgs& a, MetaResult& m) {
  const Tensor& w = a.inputs[0];
  TPU_CHECK(w.dim() == 2, "{}: expected a 2-D weight [out_features, in_features], got {}", op, describe(w));
  TPU_CHECK(float_input(w.dtype()), "{}: expected an f32, bf16 or f16 weight, got {}", op, describe(w));
  m.num_outputs = 2;
  m.out(0) = {w.shape(), qtype, w.device()};
  m.out(1) = {Shape{w.shape()[0]}, DType::f32, w.device()};
  m.cast_mask = 1;
  m.cast_to = DType::f32;
}

// max |x| over x[0, n), every value checked finite (an error naming the op, the weight's row and
// the column, x[0] being column col0).
float finite_amax(const char* op, const float* x, int64_t n, int64_t row, int64_t col0) {
  float amax = 0;
  for (int64_t k = 0; k < n; ++k) {
    TPU_CHECK(std::isfinite(x[k]), "{}: row {} of the weight holds a non-finite value ({}) at column {}", op, row, x[k],
              col0 + k);
    amax = std::max(amax, std::fabs(x[k]));
  }
  return amax;
}

// The output of a linear layer with a quantized weight of N output and K input features: x
// [..., K] (f32, bf16 or f16) -> [..., N] in x's dtype, the scales (input 2) cast to f32. x keeps
// its dtype (a chip kernel streams bf16 activations as they are); the cpu kernels widen it.
void quantized_linear_meta(const char* op, int64_t N, int64_t K, const Tensor& q, const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  TPU_CHECK(x.dim() >= 1 && float_input(x.dtype()), "{}: expected an f32, bf16 or f16 input [..., {}], got {}", op, K,
            describe(x));
  TPU_CHECK(x.shape()[x.dim() - 1] == K,
            "{}: the input's last dim {} does not match the weight's in_features {} (input {}, weight {})", op,
            x.shape()[x.dim() - 1], K, describe(x), describe(q));
  std::vector<int64_t> os = x.shape().vec();
  os.back() = N;
  m.out() = {Shape(os), x.dtype(), common_device(a.inputs)};
  m.cast_mask = 4u;  // the scales in f32; x and the weight stay as they are
  m.cast_to = DType::f32;
}

// x as a contiguous f32 tensor (the cpu kernels read f32 activations).
Tensor f32_activations(const Tensor& x) { return contiguous(x.dtype() == DType::f32 ? x : tpu::to(x, DType::f32)); }

// Runs `product(acc, M)` into f32 accumulators shaped as `out` (M rows of N), then stores them in
// out's dtype (out itself when it is f32).
template <class Product>
void into_output_dtype(Tensor& out, int64_t N, Product product) {
  Tensor acc = out.dtype() == DType::f32 ? out : empty_tensor(out.shape(), DType::f32, Device());
  product(acc.data<float>(), out.numel() / std::max<int64_t>(N, 1));
  if (out.dtype() == DType::bf16) {
    bf16* o = out.data<bf16>();
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = bf16(acc.data<float>()[i]);
  } else if (out.dtype() == DType::f16) {
    f16* o = out.data<f16>();
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = f16(acc.data<float>()[i]);
  }
}

void quantize_meta(const MetaArgs& a, MetaResult& m) { per_channel_quantize_meta("quantize_int8", DType::i8, a, m); }

void quantize_cpu(const KernelArgs& a) {
  const Tensor w = contiguous(a.inputs[0]);
  const int64_t N = w.shape()[0], K = w.shape()[1];
  const float* src = w.data<float>();
  int8_t* q = a.outputs[0].data<int8_t>();
  float* scale = a.outputs[1].data<float>();
  for (int64_t j = 0; j < N; ++j) {
    const float* row = src + j * K;
    const float amax = finite_amax("quantize_int8", row, K, j, 0);
    const float s = amax > 0 ? amax / 127.0f : 1.0f;
    scale[j] = s;
    for (int64_t k = 0; k < K; ++k) {
      const float r = std::nearbyint(row[k] / s);  // ties to even (the default rounding mode)
      q[j * K + k] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
}
TPU_DEFINE_OP(quantize_int8_op, {.name = "quantize_int8", .num_inputs = 1, .flags = kNonDifferentiable,
                                 .meta = &quantize_meta, .cpu = &quantize_cpu,
                                 .doc = "symmetric int8 quantization per output channel (q, scale)"});

void check_q_scale(const char* op, const Tensor& q, const Tensor& s) {
  TPU_CHECK(q.dim() == 2 && q.dtype() == DType::i8, "{}: expected an int8 weight [out_features, in_features], got {}", op,
            describe(q));
  TPU_CHECK(s.dim() == 1 && s.shape()[0] == q.shape()[0] && float_input(s.dtype()),
            "{}: expected float scales of shape [{}] (one per output feature), got {}", op, q.shape()[0], describe(s));
}

void dequantize_meta(const MetaArgs& a, MetaResult& m) {
  check_q_scale("dequantize_int8", a.inputs[0], a.inputs[1]);
  m.out() = {a.inputs[0].shape(), DType::f32, common_device(a.inputs)};
  m.cast_mask = 2;
  m.cast_to = DType::f32;
}
void dequantize_cpu(const KernelArgs& a) {
  const Tensor q = contiguous(a.inputs[0]), s = contiguous(a.inputs[1]);
  const int64_t N = q.shape()[0], K = q.shape()[1];
  const int8_t* qp = q.data<int8_t>();
  const float* sp = s.data<float>();
  float* out = a.outputs[0].data<float>();
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k) out[j * K + k] = static_cast<float>(qp[j * K + k]) * sp[j];
}
TPU_DEFINE_OP(dequantize_int8_op, {.name = "dequantize_int8", .num_inputs = 2, .flags = kNonDifferentiable,
                                   .meta = &dequantize_meta, .cpu = &dequantize_cpu,
                                   .doc = "q * scale per row, as f32"});

void linear_int8_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& q = a.inputs[1];
  check_q_scale("linear_int8", q, a.inputs[2]);
  quantized_linear_meta("linear_int8", q.shape()[0], q.shape()[1], q, a, m);
}

void linear_int8_cpu(const KernelArgs& a) {
  const Tensor x = f32_activations(a.inputs[0]), q = contiguous(a.inputs[1]), s = contiguous(a.inputs[2]);
  const int64_t N = q.shape()[0], K = q.shape()[1];
  into_output_dtype(a.outputs[0], N, [&](float* acc, int64_t M) {
    const bool amx = M >= kernels::kGemmInt8AmxMinRows &&
                     kernels::gemm_int8_amx(M, N, K, x.data<float>(), K, q.data<int8_t>(), s.data<float>(), acc, N);
    if (!amx && !kernels::gemm_int8_vnni(M, N, K, x.data<float>(), K, q.data<int8_t>(), s.data<float>(), acc, N))
      kernels::gemv_int8(M, N, K, x.data<float>(), K, q.data<int8_t>(), s.data<float>(), acc, N);
  });
}
TPU_DEFINE_OP(linear_int8_op, {.name = "linear_int8", .num_inputs = 3, .flags = kNonDifferentiable,
                               .meta = &linear_int8_meta, .cpu = &linear_int8_cpu,
                               .doc = "x (q * scale)^T with int8 weights read in place, f32 accumulation"});

// ---- int4: packed nibbles with per-group scales (layout: ops/cpu/kernels/gemv_int4.h) ----

void quantize_int4_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& w = a.inputs[0];
  const int64_t group = a.attrs.get_int("group");
  TPU_CHECK(w.dim() == 2, "quantize_int4: expected a 2-D weight [out_features, in_features], got {}", describe(w));
  TPU_CHECK(float_input(w.dtype()), "quantize_int4: expected an f32, bf16 or f16 weight, got {}", describe(w));
  TPU_CHECK(group == 32 || group == 128, "quantize_int4: group size {} is not supported (32 or 128)", group);
  TPU_CHECK(w.shape()[1] % group == 0,
            "quantize_int4: in_features {} is not a multiple of the group size {} (weight {})", w.shape()[1], group,
            describe(w));
  const DType sd = a.attrs.has("scale_dtype") ? a.attrs.get_dtype("scale_dtype") : DType::f32;
  TPU_CHECK(sd == DType::f32 || sd == DType::f16, "quantize_int4: scale dtype {} is not supported (f32 or f16)", sd);
  m.num_outputs = 2;
  m.out(0) = {Shape{w.shape()[0], w.shape()[1] / 2}, DType::u8, w.device()};
  m.out(1) = {Shape{w.shape()[0], w.shape()[1] / group}, sd, w.device()};
  m.cast_mask = 1;
  m.cast_to = DType::f32;
}

void quantize_int4_cpu(const KernelArgs& a) {
  const Tensor w = contiguous(a.inputs[0]);
  const int64_t N = w.shape()[0], K = w.shape()[1], group = a.attrs.get_int("group"), G = K / group;
  const float* src = w.data<float>();
  uint8_t* q = a.outputs[0].data<uint8_t>();
  const bool half = a.outputs[1].dtype() == DType::f16;
  std::memset(q, 0, static_cast<size_t>(N * K / 2));
  for (int64_t j = 0; j < N; ++j)
    for (int64_t g = 0; g < G; ++g) {
      const float* x = src + j * K + g * group;
      const float amax = finite_amax("quantize_int4", x, group, j, g * group);
      float s = amax > 0 ? amax / 7.0f : 1.0f;
      if (half) {
        // The weights are rounded against the stored (f16) scale, so that q * scale is the
        // nearest grid point of the scale actually used.
        TPU_CHECK(s <= 65504.0f,
                  "quantize_int4: row {} columns {}..{} need a scale of {}, beyond f16's range (use f32 scales)", j,
                  g * group, (g + 1) * group - 1, s);
        f16 h(s);
        if (h.to_f32() == 0) h = f16::from_bits(1);  // below f16's smallest subnormal: the weights quantize to ~0
        a.outputs[1].data<f16>()[j * G + g] = h;
        s = h.to_f32();
      } else {
        a.outputs[1].data<float>()[j * G + g] = s;
      }
      for (int64_t k = 0; k < group; ++k) {
        const int64_t col = g * group + k;
        const int v = static_cast<int>(std::clamp(std::nearbyint(x[k] / s), -7.0f, 7.0f)) + 8;
        uint8_t& byte = q[j * (K / 2) + (col / 32) * 16 + (col % 32) % 16];
        byte = static_cast<uint8_t>(byte | ((col % 32) < 16 ? v : v << 4));
      }
    }
}
TPU_DEFINE_OP(quantize_int4_op, {.name = "quantize_int4", .num_inputs = 1, .flags = kNonDifferentiable,
                                 .meta = &quantize_int4_meta, .cpu = &quantize_int4_cpu,
                                 .doc = "symmetric int4 quantization per group of columns (packed q, scales)"});

// The group size of a packed weight q [N, K / 2] and its scales [N, K / group].
int64_t check_q4_scale(const char* op, const Tensor& q, const Tensor& s) {
  TPU_CHECK(q.dim() == 2 && q.dtype() == DType::u8,
            "{}: expected a packed int4 weight (u8 [out_features, in_features / 2]), got {}", op, describe(q));
  TPU_CHECK(s.dim() == 2 && s.shape()[0] == q.shape()[0] && s.shape()[1] > 0 && float_input(s.dtype()),
            "{}: expected float scales [{}, in_features / group], got {}", op, q.shape()[0], describe(s));
  const int64_t K = 2 * q.shape()[1];
  TPU_CHECK(K % s.shape()[1] == 0 && (K / s.shape()[1]) % 32 == 0,
            "{}: {} scales per row do not divide in_features {} into groups of a multiple of 32", op, s.shape()[1], K);
  return K / s.shape()[1];
}

// The scales (input `index`) the int4 kernels take as they are: f32, and f16 on the cpu (whose
// kernels read f16 scales natively); others (bf16, or f16 on another device, whose kernels take
// f32) are cast to f32 on their device first.
void int4_scale_cast(const MetaArgs& a, int index, MetaResult& m) {
  const DType sd = a.inputs[static_cast<size_t>(index)].dtype();
  // f16 scales reach the cpu kernels and the chip's int4 program (widened in VMEM) as they are.
  const DeviceType dt = m.out().device.type;
  const bool keep = sd == DType::f32 || (sd == DType::f16 && (dt == DeviceType::cpu || dt == DeviceType::sim));
  m.cast_mask = keep ? 0u : 1u << index;
  m.cast_to = DType::f32;
}

void dequantize_int4_meta(const MetaArgs& a, MetaResult& m) {
  check_q4_scale("dequantize_int4", a.inputs[0], a.inputs[1]);
  m.out() = {Shape{a.inputs[0].shape()[0], 2 * a.inputs[0].shape()[1]}, DType::f32, common_device(a.inputs)};
  int4_scale_cast(a, 1, m);
}

// The scales of an int4 kernel's inputs: f32 or f16 (what int4_scale_cast leaves).
kernels::Int4Scales int4_scales(const Tensor& s) {
  if (s.dtype() == DType::f16) return kernels::Int4Scales(s.data<f16>());
  TPU_CHECK(s.dtype() == DType::f32, "int4 kernels: scales of dtype {} reached the cpu kernel (f32 or f16)", s.dtype());
  return kernels::Int4Scales(s.data<float>());
}
void dequantize_int4_cpu(const KernelArgs& a) {
  const Tensor q = contiguous(a.inputs[0]), s = contiguous(a.inputs[1]);
  const int64_t N = q.shape()[0], K = 2 * q.shape()[1], G = s.shape()[1], group = K / G;
  const uint8_t* qp = q.data<uint8_t>();
  const kernels::Int4Scales sp = int4_scales(s);
  float* out = a.outputs[0].data<float>();
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k)
      out[j * K + k] = static_cast<float>(kernels::int4_at(qp + j * (K / 2), k)) * sp[j * G + k / group];
}
TPU_DEFINE_OP(dequantize_int4_op, {.name = "dequantize_int4", .num_inputs = 2, .flags = kNonDifferentiable,
                                   .meta = &dequantize_int4_meta, .cpu = &dequantize_int4_cpu,
                                   .doc = "packed int4 weight times its group scales, as f32"});

void linear_int4_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& q = a.inputs[1];
  check_q4_scale("linear_int4", q, a.inputs[2]);
  quantized_linear_meta("linear_int4", q.shape()[0], 2 * q.shape()[1], q, a, m);
  int4_scale_cast(a, 2, m);
}

void linear_int4_cpu(const KernelArgs& a) {
  const Tensor x = f32_activations(a.inputs[0]), q = contiguous(a.inputs[1]), s = contiguous(a.inputs[2]);
  const int64_t N = q.shape()[0], K = 2 * q.shape()[1], group = K / s.shape()[1];
  const kernels::Int4Scales sc = int4_scales(s);
  into_output_dtype(a.outputs[0], N, [&](float* acc, int64_t M) {
    const bool amx = M >= kernels::kGemmInt8AmxMinRows &&
                     kernels::gemm_int4_amx(M, N, K, group, x.data<float>(), K, q.data<uint8_t>(), sc, acc, N);
    if (amx || kernels::gemm_int4_vnni(M, N, K, group, x.data<float>(), K, q.data<uint8_t>(), sc, acc, N)) return;
    // Few rows: the vnni kernel on the weight repacked to panels (int4_repack.h) when the weight
    // and its scales are the caller's tensors (a contiguous copy made here would die with the call).
    if (a.inputs[1].is_contiguous() && a.inputs[2].is_contiguous() &&
        kernels::int8_gemv_resolve(kernels::Int8GemvPath::best) == kernels::Int8GemvPath::vnni)
      if (const auto panels = int4_panels_for(q, s, group)) {
        kernels::gemv_int4_panels(M, N, K, group, x.data<float>(), K, panels->data, panels->f16_scales, acc, N);
        return;
      }
    kernels::gemv_int4(M, N, K, group, x.data<float>(), K, q.data<uint8_t>(), sc, acc, N);
  });
}
TPU_DEFINE_OP(linear_int4_op, {.name = "linear_int4", .num_inputs = 3, .flags = kNonDifferentiable,
                               .meta = &linear_int4_meta, .cpu = &linear_int4_cpu,
                               .doc = "x (dequantized int4 weight)^T with the weight unpacked in registers"});

// ---- fp8 e4m3 weight-only, one scale per output channel; the weight is held as u8 e4m3 bit
// patterns (float8 tensors are storage types that compute ops refuse) ----

void quantize_fp8_meta(const MetaArgs& a, MetaResult& m) { per_channel_quantize_meta("quantize_fp8", DType::u8, a, m); }

void quantize_fp8_cpu(const KernelArgs& a) {
  const Tensor w = contiguous(a.inputs[0]);
  const int64_t N = w.shape()[0], K = w.shape()[1];
  const float* src = w.data<float>();
  uint8_t* q = a.outputs[0].data<uint8_t>();
  float* scale = a.outputs[1].data<float>();
  for (int64_t j = 0; j < N; ++j) {
    const float* row = src + j * K;
    const float amax = finite_amax("quantize_fp8", row, K, j, 0);
    const float s = amax > 0 ? amax / f8e4m3::kMax : 1.0f;
    scale[j] = s;
    for (int64_t k = 0; k < K; ++k) q[j * K + k] = f8e4m3::from_f32_saturating(row[k] / s);
  }
}
TPU_DEFINE_OP(quantize_fp8_op, {.name = "quantize_fp8", .num_inputs = 1, .flags = kNonDifferentiable,
                                .meta = &quantize_fp8_meta, .cpu = &quantize_fp8_cpu,
                                .doc = "fp8 e4m3 quantization per output channel (q, scale = max|w| / 448)"});

// The scales of an fp8 weight q [N, K]: without the attrs block_n / block_k, one per output
// feature (s [N]); with them (DeepSeek-V3's fine-grained fp8), one per block of block_n rows by
// block_k columns (s [ceil(N / block_n), ceil(K / block_k)], the last blocks partial). Returns
// {block_n, block_k}, {0, 0} for per-row scales.
std::pair<int64_t, int64_t> check_f8_scale(const char* op, const Tensor& q, const Tensor& s, const Attrs& at) {
  TPU_CHECK(q.dim() == 2 && q.dtype() == DType::u8,
            "{}: expected an fp8 e4m3 weight as u8 bit patterns [out_features, in_features], got {}", op, describe(q));
  const int64_t bn = at.get_int("block_n", 0), bk = at.get_int("block_k", 0);
  if (bn == 0 && bk == 0) {
    TPU_CHECK(s.dim() == 1 && s.shape()[0] == q.shape()[0] && float_input(s.dtype()),
              "{}: expected float scales of shape [{}] (one per output feature), got {}", op, q.shape()[0],
              describe(s));
    return {0, 0};
  }
  TPU_CHECK(bn > 0 && bk > 0, "{}: the scale block must be positive, got block_n {} block_k {}", op, bn, bk);
  const int64_t N = q.shape()[0], K = q.shape()[1], rb = (N + bn - 1) / bn, cb = (K + bk - 1) / bk;
  TPU_CHECK(s.dim() == 2 && s.shape()[0] == rb && s.shape()[1] == cb && float_input(s.dtype()),
            "{}: expected float block scales of shape [{}, {}] (blocks of {}x{} over a weight of {}), got {}", op, rb,
            cb, bn, bk, describe(q), describe(s));
  return {bn, bk};
}

void dequantize_fp8_meta(const MetaArgs& a, MetaResult& m) {
  check_f8_scale("dequantize_fp8", a.inputs[0], a.inputs[1], a.attrs);
  m.out() = {a.inputs[0].shape(), DType::f32, common_device(a.inputs)};
  m.cast_mask = 2;
  m.cast_to = DType::f32;
}
void dequantize_fp8_cpu(const KernelArgs& a) {
  const Tensor q = contiguous(a.inputs[0]), s = contiguous(a.inputs[1]);
  const auto [bn, bk] = check_f8_scale("dequantize_fp8", q, s, a.attrs);
  const int64_t N = q.shape()[0], K = q.shape()[1], cb = bk > 0 ? (K + bk - 1) / bk : 0;
  const uint8_t* qp = q.data<uint8_t>();
  const float* sp = s.data<float>();
  float* out = a.outputs[0].data<float>();
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k)
      out[j * K + k] = f8e4m3::from_bits(qp[j * K + k]).to_f32() * (bn > 0 ? sp[(j / bn) * cb + k / bk] : sp[j]);
}
TPU_DEFINE_OP(dequantize_fp8_op, {.name = "dequantize_fp8", .num_inputs = 2, .flags = kNonDifferentiable,
                                  .meta = &dequantize_fp8_meta, .cpu = &dequantize_fp8_cpu,
                                  .doc = "fp8 e4m3 weight times its per-row (or, with block_n / block_k, per-block) "
                                         "scale, as f32"});

void linear_fp8_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& q = a.inputs[1];
  check_f8_scale("linear_fp8", q, a.inputs[2], a.attrs);
  quantized_linear_meta("linear_fp8", q.shape()[0], q.shape()[1], q, a, m);
}

void linear_fp8_cpu(const KernelArgs& a) {
  const Tensor x = f32_activations(a.inputs[0]), q = contiguous(a.inputs[1]), s = contiguous(a.inputs[2]);
  const std::pair<int64_t, int64_t> block = check_f8_scale("linear_fp8", q, s, a.attrs);
  const int64_t N = q.shape()[0], K = q.shape()[1], bn = block.first, bk = block.second;
  into_output_dtype(a.outputs[0], N, [&](float* acc, int64_t M) {
    if (bn > 0)
      kernels::gemv_fp8_block(M, N, K, bn, bk, x.data<float>(), K, q.data<uint8_t>(), s.data<float>(), acc, N);
    else
      kernels::gemv_fp8(M, N, K, x.data<float>(), K, q.data<uint8_t>(), s.data<float>(), acc, N);
  });
}
TPU_DEFINE_OP(linear_fp8_op, {.name = "linear_fp8", .num_inputs = 3, .flags = kNonDifferentiable,
                              .meta = &linear_fp8_meta, .cpu = &linear_fp8_cpu,
                              .doc = "x (fp8 e4m3 weight * scale)^T with the weight widened in registers; scales per "
                                     "row, or per block of block_n x block_k (attrs) for a 2-D scale tensor"});

}  // namespace
}  // namespace tpu
