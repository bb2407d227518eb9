/// @file
/// Element types and PyTorch's type-promotion rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tpucore/core/half.h"

namespace tpu {

/// The element type of a tensor: f32, bf16, f16 (16-bit floats round to nearest even), i32,
/// i8, u8, boolean (printed "bool") and i64.
///
/// i64 comes last so the numbering of the older types stays stable; it serves token ids,
/// positions and index results (argmax) as in PyTorch. Integer scalars still default to i32.
enum class DType : uint8_t { f32, bf16, f16, i32, i8, u8, boolean, i64 };
/// Number of DType values.
inline constexpr int kNumDTypes = 8;

/// Bytes per element of `t`.
size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  ///< "f32", "bf16", ..., "bool"
DType parse_dtype(std::string_view s);  ///< accepts the names above and "float32", "int32", ...; else a tpu::Error
/// True for f32, bf16 and f16.
bool is_floating(DType t);
/// True for the integer types; bool counts only when `include_bool`.
bool is_integral(DType t, bool include_bool = false);

/// Category used by scalar promotion: bool < integer < floating.
enum class DTypeCategory : uint8_t { boolean = 0, integer = 1, floating = 2 };
/// The promotion category of `t`.
DTypeCategory dtype_category(DType t);

/// The smallest type both a and b convert to without losing range (PyTorch's table, restricted
/// to our types: e.g. u8 + i8 -> i32 here since we have no i16; bf16 + f16 -> f32).
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

/// @endcond
/// Calls fn(T{}) with T the C++ type of dtype t.
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
  }
  return fn(float{});
}

}  // namespace tpu
