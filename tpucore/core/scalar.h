/// @file
/// Scalar: a Python-style number (float, int or bool) passed to ops and returned by item().
#pragma once

#include <cstdint>
#include <string>

#include "tpucore/core/dtype.h"

namespace tpu {

class Scalar {
 public:
  enum class Kind : uint8_t { floating, integer, boolean };
  Scalar() : kind_(Kind::integer), i_(0) {}
  Scalar(double v) : kind_(Kind::floating), d_(v) {}
  Scalar(float v) : kind_(Kind::floating), d_(v) {}
  Scalar(int v) : kind_(Kind::integer), i_(v) {}
  Scalar(long v) : kind_(Kind::integer), i_(v) {}
  Scalar(long long v) : kind_(Kind::integer), i_(v) {}
  Scalar(unsigned v) : kind_(Kind::integer), i_(v) {}
  Scalar(bool v) : kind_(Kind::boolean), i_(v ? 1 : 0) {}

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::floating; }
  bool is_integer() const { return kind_ == Kind::integer; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  double to_double() const { return kind_ == Kind::floating ? d_ : static_cast<double>(i_); }
  int64_t to_int() const { return kind_ == Kind::floating ? static_cast<int64_t>(d_) : i_; }
  bool to_bool() const { return kind_ == Kind::floating ? d_ != 0.0 : i_ != 0; }
  /// The dtype a wrapped scalar of this kind takes part in type promotion with.
  DType dtype() const {
    return kind_ == Kind::floating ? DType::f32 : kind_ == Kind::integer ? DType::i32 : DType::boolean;
  }
  std::string str() const;

 private:
  Kind kind_;
  union {
    double d_;
    int64_t i_;
  };
};

}  // namespace tpu
