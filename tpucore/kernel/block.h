// Block values and the operations a kernel body applies to them (tpucore/kernel.h is the entry).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tpucore/core/dtype.h"

namespace tpu::kernel {

/// A value on blocks inside a kernel body: an N-d array of f32, bf16, i32, i8 or bool with a static
/// shape. It lives in vector memory while the kernel runs (in the cpu interpreter, on the host).
/// Values are immutable: every operation makes a new one.
class Value {
 public:
  /// The backend's storage of the value (the interpreter's host array).
  struct Impl;
  /// An undefined value.
  Value() = default;
  /// A value of `shape` and `dtype` over a backend's storage.
  Value(std::vector<int64_t> shape, DType dtype, std::shared_ptr<Impl> impl);
  /// Dimensions, outermost first.
  const std::vector<int64_t>& shape() const { return shape_; }
  /// Number of dimensions.
  int rank() const { return static_cast<int>(shape_.size()); }
  /// Size of dimension `d` (negative counts from the end).
  int64_t dim(int d) const;
  /// Element type.
  DType dtype() const { return dtype_; }
  /// Number of elements.
  int64_t numel() const;
  /// False for a default-constructed value.
  bool defined() const { return impl_ != nullptr; }
  /// The backend's storage.
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  std::vector<int64_t> shape_;
  DType dtype_ = DType::f32;
  std::shared_ptr<Impl> impl_;
};

/// Options of kernel::dot.
struct DotOptions {
  bool transpose_a = false;  ///< use a^T ([k, m] given)
  bool transpose_b = false;  ///< use b^T ([n, k] given)
};

/// Matrix product of two 2-d blocks with f32 accumulation: [m, k] x [k, n] -> [m, n] f32. Both
/// operands have the same dtype, f32 or bf16 (bf16 products are exact in f32); or both i8, with
/// exact integer products accumulated in i32: an i32 result.
Value dot(const Value& a, const Value& b, DotOptions opt = {});

/// Elementwise arithmetic with numpy broadcasting; operands of one dtype (a scalar takes the
/// other operand's dtype). f32 and bf16 results are rounded to their dtype after each operation.
Value operator+(const Value& a, const Value& b);
/// Elementwise difference.
Value operator-(const Value& a, const Value& b);
/// Elementwise product.
Value operator*(const Value& a, const Value& b);
/// Elementwise quotient (integer division truncates toward zero; by zero is an error).
Value operator/(const Value& a, const Value& b);
/// Negation.
Value operator-(const Value& a);
/// a + scalar.
Value operator+(const Value& a, double s);
/// scalar + a.
Value operator+(double s, const Value& a);
/// a - scalar.
Value operator-(const Value& a, double s);
/// scalar - a.
Value operator-(double s, const Value& a);
/// a * scalar.
Value operator*(const Value& a, double s);
/// scalar * a.
Value operator*(double s, const Value& a);
/// a / scalar.
Value operator/(const Value& a, double s);
/// scalar / a.
Value operator/(double s, const Value& a);
/// Elementwise maximum (NaN propagates).
Value maximum(const Value& a, const Value& b);
/// Elementwise minimum (NaN propagates).
Value minimum(const Value& a, const Value& b);
/// Elementwise maximum with a scalar.
Value maximum(const Value& a, double s);
/// Elementwise minimum with a scalar.
Value minimum(const Value& a, double s);

/// Comparisons: bool values.
Value lt(const Value& a, const Value& b);
/// a <= b.
Value le(const Value& a, const Value& b);
/// a > b.
Value gt(const Value& a, const Value& b);
/// a >= b.
Value ge(const Value& a, const Value& b);
/// a == b.
Value eq(const Value& a, const Value& b);
/// a != b.
Value ne(const Value& a, const Value& b);
/// a < scalar.
Value lt(const Value& a, double s);
/// a >= scalar.
Value ge(const Value& a, double s);
/// Logical and of two bool values.
Value logical_and(const Value& a, const Value& b);

/// cond ? a : b elementwise (cond bool; a, b of one dtype; all three broadcast).
Value where(const Value& cond, const Value& a, const Value& b);
/// cond ? a : scalar.
Value where(const Value& cond, const Value& a, double b);

/// Transcendental and other unary math on float values (f32 or bf16).
Value exp(const Value& a);
/// Natural logarithm.
Value log(const Value& a);
/// Square root.
Value sqrt(const Value& a);
/// 1 / sqrt(a).
Value rsqrt(const Value& a);
/// Hyperbolic tangent.
Value tanh(const Value& a);
/// 1 / (1 + exp(-a)).
Value sigmoid(const Value& a);
/// 1 / a.
Value reciprocal(const Value& a);
/// Absolute value (any numeric dtype).
Value abs(const Value& a);
/// max(a, 0) (any numeric dtype).
Value relu(const Value& a);

/// Conversion to another dtype (to bool: a != 0; to i32: truncation toward zero).
Value cast(const Value& a, DType dtype);

/// Sum along `axis` (negative counts from the end), in f32 for float values; keepdims keeps the
/// reduced axis as size 1.
Value sum(const Value& a, int axis, bool keepdims = true);
/// Maximum along `axis`.
Value max(const Value& a, int axis, bool keepdims = true);
/// Minimum along `axis`.
Value min(const Value& a, int axis, bool keepdims = true);
/// Sum of each row of a 2-d block: [m, n] -> [m, 1].
Value row_sum(const Value& a);
/// Maximum of each row of a 2-d block: [m, n] -> [m, 1].
Value row_max(const Value& a);

/// `a` broadcast (numpy rules) to `shape`.
Value broadcast_to(const Value& a, const std::vector<int64_t>& shape);
/// Transpose of a 2-d block.
Value transpose(const Value& a);
/// Indices along `axis` of an array of `shape` (i32 by default, or f32).
Value iota(const std::vector<int64_t>& shape, int axis, DType dtype = DType::i32);
/// An array of `shape` filled with `value`.
Value full(const std::vector<int64_t>& shape, double value, DType dtype = DType::f32);

}  // namespace tpu::kernel
