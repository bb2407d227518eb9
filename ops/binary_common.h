// Shared pieces of the elementwise op files (binary.cpp, compare_logical.cpp, unary*.cpp,
// where_clamp.cpp, inplace.cpp): the meta rule of broadcasting ops, wrapped scalars, and
// cpu helpers that compute in the element type's compute type with well-defined integer
// overflow (two's complement wrap-around, as PyTorch and XLA).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "ops/cpu/kernels/half_convert.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu::ops::elementwise {

// Fills the output of a broadcasting op over all inputs: shape = broadcast of the inputs,
// device = common device (a wrapped scalar may live elsewhere), inputs in `cast_mask` are
// converted to `compute` by the front half. Returns nothing; the caller picks the dtypes.
inline void broadcast_setup(const MetaArgs& a, MetaResult& m, DType compute, DType out, uint32_t cast_mask) {
  m.out() = {broadcast_inputs(a.op, a.inputs), out, common_device(a.inputs)};
  m.cast_mask = cast_mask;
  m.cast_to = compute;
}

// Result dtype of `t op s` for a Tensor-scalar op (the scalar is a wrapped number).
inline DType scalar_result_type(const Tensor& t, Scalar s) {
  ResultTypeState st;
  st.update(t.dtype(), t.dim() == 0, t.impl().wrapped_number);
  st.update(s.dtype(), true, true);
  return st.result();
}

// The value of a scalar as element type T (ints wrap as a C++ cast does, bool is != 0).
template <class T>
T scalar_as(Scalar s) {
  if constexpr (std::is_same_v<T, bool>) {
    return s.to_bool();
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(s.to_double());
  } else if constexpr (std::is_integral_v<T>) {
    if (s.is_floating()) return cpu::convert<T>(s.to_double());
    return static_cast<T>(s.to_int());
  } else {  // bf16 / f16
    return T(static_cast<float>(s.to_double()));
  }
}

// A 0-d cpu tensor holding s as dtype, marked as a wrapped number. Tensor-scalar ops make it
// directly in the dtype the op computes in, which promotes exactly like a wrapped scalar of
// the scalar's own kind and saves the front half a cast.
Tensor wrapped_scalar_as(Scalar s, DType dtype);

// ---- cpu helpers ----

// Wrapping integer arithmetic (int32/int64 overflow is undefined in C++; do it unsigned).
template <class C>
inline C wrap_add(C a, C b) {
  if constexpr (std::is_same_v<C, int32_t> || std::is_same_v<C, int64_t>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
  }
  else return a + b;
}
template <class C>
inline C wrap_sub(C a, C b) {
  if constexpr (std::is_same_v<C, int32_t> || std::is_same_v<C, int64_t>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) - static_cast<U>(b));
  }
  else return a - b;
}
template <class C>
inline C wrap_mul(C a, C b) {
  if constexpr (std::is_same_v<C, int32_t> || std::is_same_v<C, int64_t>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
  }
  else return a * b;
}

// out[i] = f(a[i], b[i]) with both inputs of element type T and the output of type TO,
// f working in compute_t<T>.
template <class T, class TO, class F>
void map_binary(const KernelArgs& k, F f) {
  using C = cpu::compute_t<T>;
  cpu::binary_map<TO, T, T>(k.outputs[0], k.inputs[0], k.inputs[1], [f](T x, T y) {
    return cpu::convert<TO>(f(cpu::convert<C>(x), cpu::convert<C>(y)));
  });
}

template <class T, class TO, class F>
void map_unary(const Tensor& out, const Tensor& in, F f) {
  using C = cpu::compute_t<T>;
  cpu::unary_map<TO, T>(out, in, [f](T x) { return cpu::convert<TO>(f(cpu::convert<C>(x))); });
}

// f32 binary op through the vectorized table: contiguous runs (and runs against one
// broadcast value) go to the vector kernel, other strided runs to the scalar functor.
// `commutes` allows the broadcast value to be on either side.
template <class F>
void f32_binary(const KernelArgs& k, cpu::VecBinary op, float alpha, bool commutes, F scalar_f) {
  const Tensor& out = k.outputs[0];
  const Tensor& x = k.inputs[0];
  const Tensor& y = k.inputs[1];
  const cpu::VecBinaryFn fn = cpu::vec_math().get(op);
  const int64_t n = out.numel();
  if (n == 0) return;
  if (x.is_contiguous() && y.is_contiguous() && x.numel() == n && y.numel() == n) {
    float* o = out.data<float>();
    const float* a = x.data<float>();
    const float* b = y.data<float>();
    parallel_for(0, n, cpu::kParallelGrain,
                 [&](int64_t s, int64_t e) { fn(o + s, a + s, b + s, false, alpha, e - s); });
    return;
  }
  std::array<char*, 3> base{cpu::byte_ptr(out), cpu::byte_ptr(x), cpu::byte_ptr(y)};
  std::array<Shape, 3> st{cpu::broadcast_byte_strides(out, out.shape()), cpu::broadcast_byte_strides(x, out.shape()),
                          cpu::broadcast_byte_strides(y, out.shape())};
  cpu::for_each_run<3>(out.shape(), base, st, [&](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t len) {
    float* o = reinterpret_cast<float*>(p[0]);
    const float* a = reinterpret_cast<const float*>(p[1]);
    const float* b = reinterpret_cast<const float*>(p[2]);
    if (s[0] == 4 && s[1] == 4 && s[2] == 4) {
      fn(o, a, b, false, alpha, len);
    } else if (s[0] == 4 && s[1] == 4 && s[2] == 0) {
      fn(o, a, b, true, alpha, len);
    } else if (commutes && s[0] == 4 && s[1] == 0 && s[2] == 4) {
      fn(o, b, a, true, alpha, len);
    } else {
      for (int64_t i = 0; i < len; ++i)
        *reinterpret_cast<float*>(p[0] + i * s[0]) =
            scalar_f(*reinterpret_cast<const float*>(p[1] + i * s[1]), *reinterpret_cast<const float*>(p[2] + i * s[2]));
    }
  });
}

// f16 binary op through the vectorized f32 table: each run is widened in blocks (contiguous
// runs by vcvtph2ps), computed in f32 and rounded back, the results of map_binary with
// f(float, float) when the table's op rounds like `scalar_f` (add with alpha 1, mul).
template <class F>
void f16_binary(const KernelArgs& k, cpu::VecBinary op, float alpha, F scalar_f) {
  const Tensor& out = k.outputs[0];
  const Tensor& x = k.inputs[0];
  const Tensor& y = k.inputs[1];
  const cpu::VecBinaryFn fn = cpu::vec_math().get(op);
  if (out.numel() == 0) return;
  std::array<char*, 3> base{cpu::byte_ptr(out), cpu::byte_ptr(x), cpu::byte_ptr(y)};
  std::array<Shape, 3> st{cpu::broadcast_byte_strides(out, out.shape()), cpu::broadcast_byte_strides(x, out.shape()),
                          cpu::broadcast_byte_strides(y, out.shape())};
  cpu::for_each_run<3>(out.shape(), base, st, [&](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t len) {
    if (s[0] != int64_t{sizeof(f16)}) {
      for (int64_t i = 0; i < len; ++i)
        *reinterpret_cast<f16*>(p[0] + i * s[0]) = f16(scalar_f(float(*reinterpret_cast<const f16*>(p[1] + i * s[1])),
                                                                float(*reinterpret_cast<const f16*>(p[2] + i * s[2]))));
      return;
    }
    constexpr int64_t kBlock = 256;
    float a[kBlock], b[kBlock];
    for (int64_t j = 0; j < len; j += kBlock) {
      const int64_t m = std::min(kBlock, len - j);
      kernels::load_run_f32<f16>(p[1] + j * s[1], s[1], m, a);
      kernels::load_run_f32<f16>(p[2] + j * s[2], s[2], m, b);
      fn(a, a, b, false, alpha, m);
      kernels::store_run_f32<f16>(p[0] + j * s[0], s[0], m, a);
    }
  });
}

}  // namespace tpu::ops::elementwise
