// Whole-tensor comparisons returning host bools: allclose (|a - b| <= atol + rtol |b|, with
// broadcasting) and equal (same shape and the same values). Both read the values on the host
// (a graph break while tracing) and compare in double after promoting both to one dtype.
#include <cmath>
#include <limits>

#include "ops/binary_common.h"
#include "tpucore/core/hooks.h"

namespace tpu {
namespace {
using namespace ops;

// Exact for every element type (ints do not go through f32).
template <class T>
double as_double(T v) {
  if constexpr (std::is_integral_v<T>) return static_cast<double>(v);
  else return static_cast<double>(static_cast<float>(v));
}

// Calls f(a_i, b_i) (as doubles) over the broadcast of a and b until f returns false.
template <class F>
bool all_pairs(const char* op, const Tensor& a_p, const Tensor& b_p, F f) {
  TPU_CHECK(a_p.defined() && b_p.defined(), "{}: undefined tensor", op);
  // A deferred eager value is read (a flush), as item() does; a traced one inside compile cannot.
  auto real = [op](const Tensor& x) { return x.is_proxy() && detail::proxy_deferred(x) ? detail::materialize_proxy(x, op) : x; };
  const Tensor a_in = real(a_p), b_in = real(b_p);
  TPU_CHECK(!a_in.is_proxy() && !b_in.is_proxy(), "{}: needs concrete values; it cannot run on traced tensors", op);
  const Shape shape = broadcast_shapes(a_in.shape(), b_in.shape(), op);
  const DType t = promote_types(a_in.dtype(), b_in.dtype());
  ops::EagerScope eager;  // no recording for the copies below: they are read at once
  const Tensor a = to(to(a_in, Device()), t);
  const Tensor b = to(to(b_in, Device()), t);
  bool ok = true;
  dispatch_dtype(t, [&](auto z) {
    using T = decltype(z);
    std::array<char*, 2> base{cpu::byte_ptr(a), cpu::byte_ptr(b)};
    std::array<Shape, 2> st{cpu::broadcast_byte_strides(a, shape), cpu::broadcast_byte_strides(b, shape)};
    // Serial on purpose: the early exit and the shared flag stay simple.
    cpu::for_each_run<2>(shape, base, st, [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
      for (int64_t i = 0; i < n && ok; ++i)
        ok = f(as_double(*reinterpret_cast<const T*>(p[0] + i * s[0])), as_double(*reinterpret_cast<const T*>(p[1] + i * s[1])));
    }, std::numeric_limits<int64_t>::max());
  });
  return ok;
}

}  // namespace

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  TPU_CHECK(rtol >= 0 && atol >= 0, "allclose: rtol and atol must be non-negative, got rtol={} atol={}", rtol, atol);
  return all_pairs("allclose", a, b, [&](double x, double y) {
    if (std::isnan(x) || std::isnan(y)) return equal_nan && std::isnan(x) && std::isnan(y);
    if (x == y) return true;  // also equal infinities
    if (std::isinf(x) || std::isinf(y)) return false;
    return std::fabs(x - y) <= atol + rtol * std::fabs(y);
  });
}

bool equal(const Tensor& a, const Tensor& b) {
  TPU_CHECK(a.defined() && b.defined(), "equal: undefined tensor");
  if (a.shape() != b.shape()) return false;
  return all_pairs("equal", a, b, [](double x, double y) { return x == y; });
}

}  // namespace tpu
