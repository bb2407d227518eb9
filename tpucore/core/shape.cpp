#include "tpucore/core/shape.h"

#include <fmt/format.h>

#include "tpucore/core/error.h"

namespace tpu {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  TPU_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), "Shape: {} dimensions given, at most {} are supported",
            dims.size(), kMaxDims);
  n_ = static_cast<int>(dims.size());
  for (int i = 0; i < n_; ++i) d_[i] = dims[i];
}

Shape Shape::filled(int ndim, int64_t value) {
  Shape s;
  s.resize(ndim, value);
  return s;
}

void Shape::push_back(int64_t v) {
  TPU_CHECK(n_ < kMaxDims, "Shape: more than {} dimensions are not supported", kMaxDims);
  d_[n_++] = v;
}

void Shape::insert(int pos, int64_t v) {
  TPU_CHECK(n_ < kMaxDims, "Shape: more than {} dimensions are not supported", kMaxDims);
  for (int i = n_; i > pos; --i) d_[i] = d_[i - 1];
  d_[pos] = v;
  ++n_;
}

void Shape::erase(int pos) {
  for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
  --n_;
}

void Shape::resize(int n, int64_t fill) {
  TPU_CHECK(n >= 0 && n <= kMaxDims, "Shape: {} dimensions requested, at most {} are supported", n, kMaxDims);
  for (int i = n_; i < n; ++i) d_[i] = fill;
  n_ = n;
}

int64_t Shape::numel() const {
  int64_t p = 1;
  for (int i = 0; i < n_; ++i)
    if (d_[i] == 0) return 0;  // a zero dim wins over any overflow of the others
  for (int i = 0; i < n_; ++i)
    TPU_CHECK(!__builtin_mul_overflow(p, d_[i], &p), "shape {}: the element count overflows a 64-bit integer",
              str());
  return p;
}

std::string Shape::str() const { return fmt::format("[{}]", fmt::join(begin(), end(), ", ")); }

bool operator==(const Shape& a, const Shape& b) {
  if (a.n_ != b.n_) return false;
  for (int i = 0; i < a.n_; ++i)
    if (a.d_[i] != b.d_[i]) return false;
  return true;
}

Shape contiguous_strides(const Shape& shape) {
  Shape s = Shape::filled(shape.ndim(), 1);
  int64_t acc = 1;
  for (int i = shape.ndim() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape[i] > 0 ? shape[i] : 1;
  }
  return s;
}

int wrap_dim(int64_t dim, int ndim, const char* op) {
  int64_t n = ndim == 0 ? 1 : ndim;  // a 0-d tensor accepts dim 0 / -1
  TPU_CHECK(dim >= -n && dim < n, "{}: dim {} is out of range for a tensor of {} dimension(s) (expected in [{}, {}])",
            op, dim, ndim, -n, n - 1);
  return static_cast<int>(dim < 0 ? dim + n : dim);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  int n = a.ndim() > b.ndim() ? a.ndim() : b.ndim();
  Shape r = Shape::filled(n, 1);
  for (int i = 0; i < n; ++i) {
    int ia = a.ndim() - n + i, ib = b.ndim() - n + i;
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    TPU_CHECK(da == db || da == 1 || db == 1,
              "{}: shapes {} and {} cannot be broadcast (dimension {}: {} vs {})", op, a.str(), b.str(), i, da, db);
    r[i] = da == 1 ? db : da;
  }
  return r;
}

int64_t checked_numel(const Shape& shape, const char* op) {
  for (int i = 0; i < shape.ndim(); ++i)
    TPU_CHECK(shape[i] >= 0, "{}: negative dimension {} in shape {}", op, shape[i], shape.str());
  int64_t n = 1;
  bool overflow = false;
  for (int i = 0; i < shape.ndim(); ++i) {
    if (shape[i] == 0) return 0;
    overflow |= __builtin_mul_overflow(n, shape[i], &n);
  }
  TPU_CHECK(!overflow && n <= kMaxNumel, "{}: shape {} has {} elements, more than the limit of {} (2^46) per tensor",
            op, shape.str(), overflow ? std::string("more than 2^63") : std::to_string(n), kMaxNumel);
  return n;
}

}  // namespace tpu
