// Elementwise indexing along one dim: gather(x, dim, index) reads x at index values,
// scatter_add(x, dim, index, src) returns a copy of x with src added at index values.
// Index values are checked against the indexed dim before any is used.
#include <limits>

#include "ops/index_common.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// index.size(k) <= limit.size(k) for every k (except `skip`, when >= 0).
void check_index_fits(const char* op, const Tensor& index, const Tensor& limit, const char* limit_name, int skip) {
  for (int k = 0; k < index.dim(); ++k) {
    if (k == skip) continue;
    TPU_CHECK(index.shape()[k] <= limit.shape()[k],
              "{}: index of shape {} does not fit {} of shape {}: index.size({}) = {} is larger than {}.size({}) = {}", op,
              index.shape().str(), limit_name, limit.shape().str(), k, index.shape()[k], limit_name, k, limit.shape()[k]);
  }
}

void gather_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const Tensor& index = a.inputs[1];
  indexing::check_index_dtype("gather", "index", index);
  TPU_CHECK(index.dim() == x.dim(), "gather: index must have as many dims as x, got index shape {} and x shape {}",
            index.shape().str(), x.shape().str());
  const int d = wrap_dim(a.attrs.get_int("dim"), x.dim(), "gather");
  check_index_fits("gather", index, x, "x", d);
  m.out() = {index.shape(), x.dtype(), x.device()};
  m.cast_mask = 1u << 1;
  m.cast_to = DType::i32;
}

template <class E>  // an unsigned integer type of the element's size: the bytes are just moved
void gather_run(const Tensor& out, const Tensor& x, const Tensor& index, int d) {
  Shape xst = indexing::byte_strides(x);
  const int64_t sd = x.dim() ? xst[d] : 0;
  if (x.dim()) xst[d] = 0;  // the dim's offset comes from the index value
  Shape ost = contiguous_strides(out.shape());
  for (int k = 0; k < ost.ndim(); ++k) ost[k] *= static_cast<int64_t>(sizeof(E));
  std::array<char*, 3> base{cpu::byte_ptr(out), cpu::byte_ptr(index), cpu::byte_ptr(x)};
  std::array<Shape, 3> st{ost, indexing::byte_strides(index), xst};
  cpu::for_each_run<3>(out.shape(), base, st, [sd](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t n) {
    E* o = reinterpret_cast<E*>(p[0]);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t v = load<int32_t>(p[1] + i * s[1]);
      *reinterpret_cast<E*>(reinterpret_cast<char*>(o) + i * s[0]) = load<E>(p[2] + i * s[2] + v * sd);
    }
  });
}

void gather_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& index = a.inputs[1];
  const Tensor& out = a.outputs[0];
  const int d = wrap_dim(a.attrs.get_int("dim"), x.dim(), "gather");
  indexing::check_index_range("gather", index, x.dim() ? x.shape()[d] : 1, d, "x of shape " + x.shape().str());
  if (out.numel() == 0) return;
  switch (x.element_size()) {
    case 1: gather_run<uint8_t>(out, x, index, d); break;
    case 2: gather_run<uint16_t>(out, x, index, d); break;
    case 4: gather_run<uint32_t>(out, x, index, d); break;
    default: gather_run<uint64_t>(out, x, index, d); break;
  }
}
TPU_DEFINE_OP(gather_op, {.name = "gather", .num_inputs = 2, .flags = kNone, .meta = &gather_meta, .cpu = &gather_cpu,
                          .doc = "out[i][j] = x[i][index[i][j]] (for dim 1): values of x at index along one dim"});

void scatter_add_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const Tensor& index = a.inputs[1];
  const Tensor& src = a.inputs[2];
  indexing::check_index_dtype("scatter_add", "index", index);
  TPU_CHECK(src.dtype() == x.dtype(), "scatter_add: src must have the dtype of x, got src {} and x {}",
            dtype_name(src.dtype()), dtype_name(x.dtype()));
  TPU_CHECK(index.dim() == x.dim() && src.dim() == x.dim(),
            "scatter_add: x, index and src must have the same number of dims, got shapes {}, {} and {}", x.shape().str(),
            index.shape().str(), src.shape().str());
  const int d = wrap_dim(a.attrs.get_int("dim"), x.dim(), "scatter_add");
  check_index_fits("scatter_add", index, src, "src", -1);
  check_index_fits("scatter_add", index, x, "x", d);
  m.out() = {x.shape(), x.dtype(), x.device()};
  // The cpu kernel reads i32 indices; the sim/tpu chip kernel (codegen/embedding_kernel.cpp)
  // reads them on the host as given (a cast on a chip would be a host fallback of its own).
  const DeviceType dt = x.device().type;
  m.cast_mask = (dt == DeviceType::sim || dt == DeviceType::tpu) ? 0u : 1u << 1;
  m.cast_to = DType::i32;
}

template <class A>
A accumulate(A acc, A v) {
  if constexpr (std::is_same_v<A, bool>) return acc || v;
  else return static_cast<A>(acc + v);  // integers wrap like PyTorch's
}

// Adds src into acc (a contiguous tensor of x's shape and dtype A) at the index positions.
// Several index entries may hit the same element, so the adds along `d` stay on one thread;
// when d != 0, positions with different leading coordinates write different rows and run in
// parallel over that leading dim.
template <class A>
void scatter_add_into(const Tensor& acc, const Tensor& index, const Tensor& src, int d) {
  Shape ast = contiguous_strides(acc.shape());
  for (int k = 0; k < ast.ndim(); ++k) ast[k] *= static_cast<int64_t>(sizeof(A));
  const int64_t sd = acc.dim() ? ast[d] : 0;
  if (acc.dim()) ast[d] = 0;
  std::array<char*, 3> base{cpu::byte_ptr(acc), cpu::byte_ptr(index), cpu::byte_ptr(src)};
  std::array<Shape, 3> st{ast, indexing::byte_strides(index), indexing::byte_strides(src)};
  auto add = [sd](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const int32_t v = load<int32_t>(p[1] + i * s[1]);
      A* o = reinterpret_cast<A*>(p[0] + i * s[0] + v * sd);
      *o = accumulate<A>(*o, *reinterpret_cast<const A*>(p[2] + i * s[2]));
    }
  };
  constexpr int64_t kSerial = std::numeric_limits<int64_t>::max();
  const int64_t n0 = index.dim() ? index.shape()[0] : 1;
  if (d == 0 || index.dim() < 2 || index.numel() < 2 * cpu::kParallelGrain || n0 < 2) {
    cpu::for_each_run<3>(index.shape(), base, st, add, kSerial);
    return;
  }
  Shape sub = index.shape();
  sub.erase(0);
  std::array<Shape, 3> sub_st = st;
  for (auto& x : sub_st) x.erase(0);
  parallel_for(0, n0, std::max<int64_t>(1, cpu::kParallelGrain / sub.numel()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      std::array<char*, 3> bi;
      for (int k = 0; k < 3; ++k) bi[static_cast<size_t>(k)] = base[static_cast<size_t>(k)] + i * st[static_cast<size_t>(k)][0];
      cpu::for_each_run<3>(sub, bi, sub_st, add, kSerial);
    }
  });
}

void scatter_add_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& index = a.inputs[1];
  const Tensor& src = a.inputs[2];
  const Tensor& out = a.outputs[0];
  const int d = wrap_dim(a.attrs.get_int("dim"), x.dim(), "scatter_add");
  indexing::check_index_range("scatter_add", index, x.dim() ? x.shape()[d] : 1, d, "x of shape " + x.shape().str());
  if (out.numel() == 0) return;
  dispatch_dtype(x.dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      // Accumulate the 16-bit floats in f32 and round once at the end.
      Tensor acc = empty_tensor(x.shape(), DType::f32, Device());
      Tensor src32 = empty_tensor(src.shape(), DType::f32, Device());
      cpu::unary_map<float, T>(acc, x, [](T v) { return static_cast<float>(v); });
      cpu::unary_map<float, T>(src32, src, [](T v) { return static_cast<float>(v); });
      scatter_add_into<float>(acc, index, src32, d);
      cpu::unary_map<T, float>(out, acc, [](float v) { return T(v); });
    } else {
      cpu::unary_map<T, T>(out, x, [](T v) { return v; });
      scatter_add_into<T>(out, index, src, d);
    }
  });
}
TPU_DEFINE_OP(scatter_add_op, {.name = "scatter_add", .num_inputs = 3, .flags = kNone, .meta = &scatter_add_meta,
                               .cpu = &scatter_add_cpu,
                               .doc = "a copy of x with src added at index along one dim (out-of-place)"});

}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  return ops::call(gather_op(), {x, index}, {{"dim", dim}});
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return ops::call(scatter_add_op(), {x, index, src}, {{"dim", dim}});
}

}  // namespace tpu
