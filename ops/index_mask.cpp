// Masking and index-to-mask ops: masked_fill(x, mask, value), tril/triu(x, diagonal) over
// the last two dims, one_hot(indices, num_classes).
#include <cmath>
#include <limits>

#include "ops/index_common.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/core/hooks.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

void masked_fill_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const Tensor& mask = a.inputs[1];
  TPU_CHECK(mask.dtype() == DType::boolean, "masked_fill: mask must be a bool tensor, got {} of shape {}",
            dtype_name(mask.dtype()), mask.shape().str());
  const Shape s = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  const Scalar v = a.attrs.get_scalar("value");
  if (is_integral(x.dtype())) {
    double lo = 0, hi = 1;
    switch (x.dtype()) {
      case DType::i32: lo = std::numeric_limits<int32_t>::min(); hi = std::numeric_limits<int32_t>::max(); break;
      case DType::i64: lo = -9223372036854775808.0; hi = 9223372036854774784.0; break;  // largest double below 2^63
      case DType::i8: lo = -128; hi = 127; break;
      default: lo = 0; hi = 255; break;
    }
    const double dv = v.to_double();
    TPU_CHECK(std::isfinite(dv) && dv >= lo && dv <= hi,
              "masked_fill: value {} cannot be converted to {} without overflow (x of shape {})", v.str(),
              dtype_name(x.dtype()), x.shape().str());
  }
  m.out() = {s, x.dtype(), common_device(a.inputs)};
}

void masked_fill_cpu(const KernelArgs& a) {
  const Scalar v = a.attrs.get_scalar("value");
  dispatch_dtype(a.inputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    T val;
    if constexpr (std::is_same_v<T, bool>) val = v.to_bool();
    else if constexpr (std::is_integral_v<T>) val = static_cast<T>(v.to_int());
    else val = cpu::convert<T>(v.to_double());
    cpu::binary_map<T, T, bool>(a.outputs[0], a.inputs[0], a.inputs[1], [val](T x, bool mk) { return mk ? val : x; });
  });
}
TPU_DEFINE_OP(masked_fill_op, {.name = "masked_fill", .num_inputs = 2, .flags = kElementwise, .meta = &masked_fill_meta,
                               .cpu = &masked_fill_cpu, .doc = "x with value where the (broadcast) bool mask is true"});

void triangle_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  TPU_CHECK(x.dim() >= 2, "{}: expects a tensor with at least 2 dims, got shape {}", a.op.name, x.shape().str());
  m.out() = {x.shape(), x.dtype(), x.device()};
}

// Copies the kept part of each row of the last two dims and zeroes the rest.
void triangle_cpu(const KernelArgs& a, bool lower) {
  const Tensor& x = a.inputs[0];
  const Tensor& out = a.outputs[0];
  if (out.numel() == 0) return;
  const int nd = x.dim();
  const int64_t R = x.shape()[nd - 2], C = x.shape()[nd - 1];
  // Beyond +-(R + C) every diagonal keeps all or nothing.
  const int64_t diag = std::clamp<int64_t>(a.attrs.get_int("diagonal"), -(R + C), R + C);
  const size_t es = x.element_size();
  const Shape xst = indexing::byte_strides(x);
  std::vector<int64_t> boff(static_cast<size_t>(x.numel() / (R * C)), 0);
  {
    int64_t pos[kMaxDims] = {}, off = 0;
    for (auto& b : boff) {
      b = off;
      for (int k = nd - 3; k >= 0; --k) {
        off += xst[k];
        if (++pos[k] < x.shape()[k]) break;
        off -= xst[k] * x.shape()[k];
        pos[k] = 0;
      }
    }
  }
  char* obase = cpu::byte_ptr(out);
  const char* xbase = cpu::byte_ptr(x);
  const auto e = static_cast<int64_t>(es);
  const int64_t rows = static_cast<int64_t>(boff.size()) * R;
  parallel_for(0, rows, std::max<int64_t>(1, cpu::kParallelGrain / C), [&](int64_t b, int64_t end) {
    for (int64_t p = b; p < end; ++p) {
      const int64_t i = p % R;
      const int64_t lo = lower ? 0 : std::clamp<int64_t>(i + diag, 0, C);
      const int64_t hi = lower ? std::clamp<int64_t>(i + diag + 1, 0, C) : C;
      char* dst = obase + p * C * e;
      const char* src = xbase + boff[static_cast<size_t>(p / R)] + i * xst[nd - 2];
      if (lo > 0) std::memset(dst, 0, static_cast<size_t>(lo * e));
      if (hi > lo) indexing::copy_elements(dst + lo * e, e, src + lo * xst[nd - 1], xst[nd - 1], hi - lo, es);
      if (hi < C) std::memset(dst + std::max(hi, lo) * e, 0, static_cast<size_t>((C - std::max(hi, lo)) * e));
    }
  });
}
void tril_cpu(const KernelArgs& a) { triangle_cpu(a, true); }
void triu_cpu(const KernelArgs& a) { triangle_cpu(a, false); }
TPU_DEFINE_OP(tril_op, {.name = "tril", .num_inputs = 1, .flags = kNone, .meta = &triangle_meta, .cpu = &tril_cpu,
                        .doc = "the lower triangle (col - row <= diagonal) of the last two dims, zeros elsewhere"});
TPU_DEFINE_OP(triu_op, {.name = "triu", .num_inputs = 1, .flags = kNone, .meta = &triangle_meta, .cpu = &triu_cpu,
                        .doc = "the upper triangle (col - row >= diagonal) of the last two dims, zeros elsewhere"});

void one_hot_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& idx = a.inputs[0];
  indexing::check_index_dtype("one_hot", "indices", idx);
  const int64_t c = a.attrs.get_int("num_classes");
  TPU_CHECK(c >= 0, "one_hot: num_classes must be non-negative, got {}", c);
  TPU_CHECK(idx.dim() < kMaxDims, "one_hot: indices of shape {} would give a result with more than {} dims",
            idx.shape().str(), kMaxDims);
  Shape s = idx.shape();
  s.push_back(c);
  m.out() = {s, DType::i64, idx.device()};  // int64, as PyTorch's one_hot
  m.cast_mask = 1u;
  m.cast_to = DType::i32;  // the indices, read as i32 by the kernel
}

void one_hot_cpu(const KernelArgs& a) {
  const Tensor& idx = a.inputs[0];
  const Tensor& out = a.outputs[0];
  const int64_t c = a.attrs.get_int("num_classes");
  indexing::check_index_range("one_hot", idx, c, idx.dim(), fmt::format("num_classes = {}", c));
  if (out.numel() == 0) return;
  const std::vector<int32_t> v = indexing::read_indices(idx);
  auto* o = out.data<int64_t>();
  parallel_for(0, static_cast<int64_t>(v.size()), std::max<int64_t>(1, cpu::kParallelGrain / c), [&](int64_t b, int64_t e) {
    std::memset(o + b * c, 0, static_cast<size_t>((e - b) * c) * sizeof(int64_t));
    for (int64_t i = b; i < e; ++i) o[i * c + v[static_cast<size_t>(i)]] = 1;
  });
}
TPU_DEFINE_OP(one_hot_op, {.name = "one_hot", .num_inputs = 1, .flags = kNonDifferentiable, .meta = &one_hot_meta,
                           .cpu = &one_hot_cpu, .doc = "i64 one-hot rows (a new last dim of num_classes) for integer indices"});

}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  return ops::call(masked_fill_op(), {x, mask}, {{"value", value}});
}

Tensor tril(const Tensor& x, int64_t diagonal) { return ops::call(tril_op(), {x}, {{"diagonal", diagonal}}); }
Tensor triu(const Tensor& x, int64_t diagonal) { return ops::call(triu_op(), {x}, {{"diagonal", diagonal}}); }

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  TPU_CHECK(num_classes >= -1, "one_hot: num_classes must be -1 (infer) or non-negative, got {}", num_classes);
  if (num_classes == -1) {
    indexing::check_index_dtype("one_hot", "indices", indices);
    TPU_CHECK(indices.numel() > 0, "one_hot: cannot infer num_classes from an empty tensor of shape {}; pass num_classes",
              indices.shape().str());
    int64_t mx = std::numeric_limits<int64_t>::min();
    // Inside tpu::compile the count needs the traced indices' values: a graph break, named.
    const Tensor real = indices.is_proxy()
                            ? detail::materialize_proxy(
                                  indices, "one_hot with num_classes = -1 (the output shape depends on the indices' values)")
                            : indices;
    for (int32_t v : real.to_vector<int32_t>()) mx = std::max<int64_t>(mx, v);
    num_classes = std::max<int64_t>(0, mx + 1);  // negative indices are reported by the kernel
  }
  return ops::call(one_hot_op(), {indices}, {{"num_classes", num_classes}});
}

}  // namespace tpu
