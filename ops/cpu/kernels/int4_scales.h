// The group scales of a packed int4 weight (gemv_int4.h): [N, K / group] row-major, held as f32
// or as f16 (the scale's dtype is part of the format; f16 is the byte budget of llama.cpp's
// Q4_0). Kernels take either through this view; the hot ones branch on is_f16() once per call
// and read the f16 bits with vcvtph2ps, the others convert one value at a time.
#pragma once

#include <cstdint>

#include "tpucore/core/half.h"

namespace tpu::kernels {

class Int4Scales {
 public:
  Int4Scales() = default;
  Int4Scales(const float* s) : f32_(s) {}  // NOLINT(google-explicit-constructor): either pointer is a view
  Int4Scales(const f16* s) : f16_(s) {}    // NOLINT(google-explicit-constructor)

  bool is_f16() const { return f16_ != nullptr; }
  const float* f32() const { return f32_; }
  const f16* half() const { return f16_; }
  /// Scale i as f32 (an f16 one converted exactly).
  float operator[](int64_t i) const { return f16_ ? f16_[i].to_f32() : f32_[i]; }
  /// The view from scale `off` on.
  Int4Scales operator+(int64_t off) const { return f16_ ? Int4Scales(f16_ + off) : Int4Scales(f32_ + off); }

 private:
  const float* f32_ = nullptr;
  const f16* f16_ = nullptr;
};

}  // namespace tpu::kernels
