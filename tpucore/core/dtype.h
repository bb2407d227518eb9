/// @file
/// Element types and PyTorch's type-promotion rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "tpucore/core/float8.h"
#include "tpucore/core/half.h"

namespace tpu {

/// The element type of a tensor: f32, bf16, f16 (16-bit floats round to nearest even), i32,
/// i8, u8, boolean (printed "bool") and i64.
///
/// i64 comes after them so the numbering of the older types stays stable; it serves token ids,
/// positions and index results (argmax) as in PyTorch. Integer scalars still default to i32.
///
/// f8e4m3 and f8e5m2 are the 8-bit floats of tpucore/core/float8.h (PyTorch's float8_e4m3fn
/// and float8_e5m2). As in PyTorch they are storage types: they convert (`to`), copy, view,
/// print and read back (`item`, `to_vector` through a cast), and load from / save to
/// safetensors; an op that computes on them is a tpu::Error naming the op and the dtype, and
/// they promote with no other dtype (promote_types is an error).
enum class DType : uint8_t { f32, bf16, f16, i32, i8, u8, boolean, i64, f8e4m3, f8e5m2 };
/// Number of DType values.
inline constexpr int kNumDTypes = 10;

/// Bytes per element of `t`.
size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  ///< "f32", "bf16", ..., "bool", "f8e4m3", "f8e5m2"
/// Accepts the names above and "float32", "int32", "float8_e4m3fn", ...; else a tpu::Error.
DType parse_dtype(std::string_view s);
/// True for f32, bf16, f16 and the two float8 types (as PyTorch's is_floating_point).
bool is_floating(DType t);
/// True for f8e4m3 and f8e5m2.
inline bool is_float8(DType t) { return t == DType::f8e4m3 || t == DType::f8e5m2; }
/// True for the integer types; bool counts only when `include_bool`.
bool is_integral(DType t, bool include_bool = false);

/// Category used by scalar promotion: bool < integer < floating.
enum class DTypeCategory : uint8_t { boolean = 0, integer = 1, floating = 2 };
/// The promotion category of `t`.
DTypeCategory dtype_category(DType t);

/// The smallest type both a and b convert to without losing range (PyTorch's table, restricted
/// to our types: e.g. u8 + i8 -> i32 here since we have no i16; bf16 + f16 -> f32).
/// A float8 type promotes only with itself: any other pair with a float8 type (f8e4m3 with
/// f8e5m2, f32, bool, ...) is a tpu::Error, as torch.promote_types refuses it.
DType promote_types(DType a, DType b);

/// Result type of an operation over operands of three priorities, as PyTorch's result_type:
/// tensors with dim > 0 first, then 0-d tensors, then wrapped Python-style scalars. A lower
/// priority operand only changes the result when its category is higher, in which case the
/// result is the default type of that category (f32 for floating, i32 for integers) unless
/// higher-priority operands already hold that category.
struct ResultTypeState {
  /// Per priority: the DType seen so far (as int), -1 when none.
  ///@{
  int dim_result = -1, zero_dim_result = -1, wrapped_result = -1;
  ///@}
  /// Takes part one operand of type `t`: a 0-d tensor when `zero_dim`, a wrapped scalar when
  /// `wrapped`.
  void update(DType t, bool zero_dim, bool wrapped);
  /// The result type of the operands seen so far.
  DType result() const;
};

/// Compile-time mapping between C++ types and DType.
/// dtype_of<T>::value is the DType of the C++ element type T (float, bf16, f16, int64_t,
/// int32_t, int8_t, uint8_t, bool); other types do not compile.
template <class T> struct dtype_of;
/// @cond
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::i8; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };
template <> struct dtype_of<f8e4m3> { static constexpr DType value = DType::f8e4m3; };
template <> struct dtype_of<f8e5m2> { static constexpr DType value = DType::f8e5m2; };

/// @endcond
/// The tpu::Error of a compute kernel handed a float8 tensor.
[[noreturn]] void fail_float8_compute(DType t);

/// Calls fn(T{}) with T the C++ type of dtype t, for the computing dtypes: a float8 dtype is a
/// tpu::Error (compute kernels are not instantiated for the storage-only float8 types).
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& fn) {
  switch (t) {
    case DType::f32: return fn(float{});
    case DType::bf16: return fn(bf16{});
    case DType::f16: return fn(f16{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    case DType::i8: return fn(int8_t{});
    case DType::u8: return fn(uint8_t{});
    case DType::boolean: return fn(bool{});
    case DType::f8e4m3: case DType::f8e5m2: fail_float8_compute(t);
  }
  return fn(float{});
}

/// As dispatch_dtype, for every dtype including f8e4m3 and f8e5m2 (conversion, copies, reading
/// values).
template <class F>
decltype(auto) dispatch_any_dtype(DType t, F&& fn) {
  if (t == DType::f8e4m3) return fn(f8e4m3{});
  if (t == DType::f8e5m2) return fn(f8e5m2{});
  return dispatch_dtype(t, std::forward<F>(fn));
}

}  // namespace tpu
