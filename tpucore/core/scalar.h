/// @file
/// Scalar: a Python-style number (float, int or bool) passed to ops and returned by item().
#pragma once

#include <cstdint>
#include <string>

#include "tpucore/core/dtype.h"

namespace tpu {

/// A Python-style number (float, int or bool) passed to ops and returned by Tensor::item().
/// Converts implicitly from C++ numbers. In type promotion it is a wrapped number: it changes
/// the result type only when its kind is higher (e.g. an f32 tensor times 2 stays f32, an i32
/// tensor times 0.5 becomes f32).
class Scalar {
 public:
  /// What the number is.
  enum class Kind : uint8_t { floating, integer, boolean };
  Scalar() : kind_(Kind::integer), i_(0) {}
  /// A floating scalar (held as double).
  Scalar(double v) : kind_(Kind::floating), d_(v) {}
  /// A floating scalar.
  Scalar(float v) : kind_(Kind::floating), d_(v) {}
  /// An integer scalar (held as int64).
  ///@{
  Scalar(int v) : kind_(Kind::integer), i_(v) {}
  Scalar(long v) : kind_(Kind::integer), i_(v) {}
  Scalar(long long v) : kind_(Kind::integer), i_(v) {}
  Scalar(unsigned v) : kind_(Kind::integer), i_(v) {}
  ///@}
  /// A boolean scalar.
  Scalar(bool v) : kind_(Kind::boolean), i_(v ? 1 : 0) {}

  /// What the number is.
  Kind kind() const { return kind_; }
  /// True for a floating scalar.
  bool is_floating() const { return kind_ == Kind::floating; }
  /// True for an integer scalar.
  bool is_integer() const { return kind_ == Kind::integer; }
  /// True for a boolean scalar.
  bool is_bool() const { return kind_ == Kind::boolean; }
  /// The value as double.
  double to_double() const { return kind_ == Kind::floating ? d_ : static_cast<double>(i_); }
  /// The value as int64 (a float truncates toward zero).
  int64_t to_int() const { return kind_ == Kind::floating ? static_cast<int64_t>(d_) : i_; }
  /// True when nonzero.
  bool to_bool() const { return kind_ == Kind::floating ? d_ != 0.0 : i_ != 0; }
  /// The dtype a wrapped scalar of this kind takes part in type promotion with.
  DType dtype() const {
    return kind_ == Kind::floating ? DType::f32 : kind_ == Kind::integer ? DType::i32 : DType::boolean;
  }
  /// The value as text ("1.5", "3", "true").
  std::string str() const;

 private:
  Kind kind_;
  union {
    double d_;
    int64_t i_;
  };
};

}  // namespace tpu
