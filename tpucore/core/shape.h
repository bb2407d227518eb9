/// @file
/// Shape: a small inline vector of dimension sizes (also used for strides). No heap
/// allocation; at most kMaxDims dimensions.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace tpu {

/// The most dimensions a Shape holds.
inline constexpr int kMaxDims = 8;

/// The dimension sizes of a tensor (or its strides), at most kMaxDims of them; a 0-d shape
/// (a scalar) has none. Copied by value.
class Shape {
 public:
  Shape() = default;
  /// A shape from listed sizes, e.g. Shape{2, 3}; more than kMaxDims is a tpu::Error.
  Shape(std::initializer_list<int64_t> dims);
  /// A shape from a span of sizes; more than kMaxDims is a tpu::Error.
  explicit Shape(std::span<const int64_t> dims);
  /// A shape from a vector of sizes; more than kMaxDims is a tpu::Error.
  Shape(const std::vector<int64_t>& dims) : Shape(std::span<const int64_t>(dims)) {}

  /// `ndim` dimensions, each `value`.
  static Shape filled(int ndim, int64_t value);

  /// Number of dimensions.
  int ndim() const { return n_; }
  /// Number of dimensions (container style).
  size_t size() const { return static_cast<size_t>(n_); }
  /// True for a 0-d shape.
  bool empty() const { return n_ == 0; }
  /// Size of dimension `i` (0 <= i < ndim(), not checked).
  int64_t operator[](int i) const { return d_[i]; }
  /// Size of dimension `i`, writable (0 <= i < ndim(), not checked).
  int64_t& operator[](int i) { return d_[i]; }
  /// Iteration over the sizes.
  ///@{
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }
  int64_t* begin() { return d_; }
  int64_t* end() { return d_ + n_; }
  ///@}
  /// Pointer to the ndim() sizes.
  const int64_t* data() const { return d_; }
  /// The last size (the shape must not be 0-d).
  int64_t back() const { return d_[n_ - 1]; }

  /// Appends a dimension of size `v`; past kMaxDims is a tpu::Error.
  void push_back(int64_t v);
  /// Inserts a dimension of size `v` before position `pos`; past kMaxDims is a tpu::Error.
  void insert(int pos, int64_t v);
  /// Removes dimension `pos`.
  void erase(int pos);
  /// Keeps the first `n` dimensions, adding new ones of size `fill`; past kMaxDims is a tpu::Error.
  void resize(int n, int64_t fill = 0);

  int64_t numel() const;  ///< product of dims (1 for 0-d)
  /// The sizes as a vector.
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }
  std::string str() const;  ///< "[2, 3]"

  /// Same number of dimensions and sizes.
  friend bool operator==(const Shape& a, const Shape& b);
  /// Not operator==.
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  int64_t d_[kMaxDims] = {};
  int n_ = 0;
};

/// Row-major strides of a shape (element units).
Shape contiguous_strides(const Shape& shape);

/// Wraps a possibly negative dim into [0, ndim); `op` names the caller in the error.
int wrap_dim(int64_t dim, int ndim, const char* op);

/// Broadcast two shapes (numpy rules); error names the op and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

/// The size limit of one tensor, checked where shapes are made (creation, every op's result,
/// views): 2^46 elements, 256 TiB of f32, far past the memory of any device here.
inline constexpr int64_t kMaxNumel = int64_t{1} << 46;

/// The element count of a shape `op` is about to make; an error naming `op`, the shape and the
/// limit when a dim is negative or the count passes kMaxNumel (or overflows 64 bits).
int64_t checked_numel(const Shape& shape, const char* op);

}  // namespace tpu
