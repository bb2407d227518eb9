// Creation ops: full, arange, linspace, eye, rand, randn, randint, from_buffer.
#include <cmath>
#include <cstring>
#include <mutex>

#include "device/driver.h"
#include "ops/cpu/loops.h"
#include "ops/fallback.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

Shape attr_shape(const Attrs& a) { return Shape(a.get_ints("shape")); }

void creation_meta(const MetaArgs& a, MetaResult& m) {
  Shape s = attr_shape(a.attrs);
  for (int i = 0; i < s.ndim(); ++i)
    TPU_CHECK(s[i] >= 0, "{}: negative dimension {} in shape {}", a.op.name, s[i], s.str());
  m.out() = {s, a.attrs.get_dtype("dtype"), a.attrs.get_device("device")};
}

template <class F>
void fill_with(const Tensor& out, F f) {  // f(flat index) -> double
  dispatch_dtype(out.dtype(), [&](auto z) {
    using T = decltype(z);
    T* p = static_cast<T*>(out.raw_data());
    const int64_t n = out.numel();
    parallel_for(0, n, cpu::kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = cpu::convert<T>(f(i));
    });
  });
}

void full_cpu(const KernelArgs& a) {
  const Scalar v = a.attrs.get_scalar("value");
  const Tensor& out = a.outputs[0];
  dispatch_any_dtype(out.dtype(), [&](auto z) {
    using T = decltype(z);
    T val = v.is_floating() ? cpu::convert<T>(v.to_double()) : cpu::convert<T>(static_cast<double>(v.to_int()));
    if constexpr (std::is_same_v<T, bool>) val = v.to_bool();
    T* p = static_cast<T*>(out.raw_data());
    parallel_for(0, out.numel(), cpu::kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = val;
    });
  });
}
TPU_DEFINE_OP(full_op, {.name = "full", .num_inputs = 0, .flags = kCreation | kNonDifferentiable | kFloat8, .meta = &creation_meta,
                        .cpu = &full_cpu, .doc = "a tensor filled with one value"});

void arange_cpu(const KernelArgs& a) {
  const double start = a.attrs.get_float("start"), step = a.attrs.get_float("step");
  fill_with(a.outputs[0], [&](int64_t i) { return start + step * static_cast<double>(i); });
}
TPU_DEFINE_OP(arange_op, {.name = "arange", .num_inputs = 0, .flags = kCreation | kNonDifferentiable,
                          .meta = &creation_meta, .cpu = &arange_cpu, .doc = "start, start+step, ... below end"});

void linspace_cpu(const KernelArgs& a) {
  const double start = a.attrs.get_float("start"), end = a.attrs.get_float("end");
  const int64_t n = a.outputs[0].numel();
  const double step = n > 1 ? (end - start) / static_cast<double>(n - 1) : 0.0;
  // Fill from both ends, as PyTorch does, so the last value is exactly `end` (one step: start).
  fill_with(a.outputs[0], [&](int64_t i) {
    return n == 1 ? start : i < n / 2 ? start + step * static_cast<double>(i) : end - step * static_cast<double>(n - 1 - i);
  });
}
TPU_DEFINE_OP(linspace_op, {.name = "linspace", .num_inputs = 0, .flags = kCreation | kNonDifferentiable,
                            .meta = &creation_meta, .cpu = &linspace_cpu, .doc = "evenly spaced values"});

void eye_cpu(const KernelArgs& a) {
  const int64_t cols = a.outputs[0].shape()[1];
  fill_with(a.outputs[0], [&](int64_t i) { return (i / cols) == (i % cols) ? 1.0 : 0.0; });
}
TPU_DEFINE_OP(eye_op, {.name = "eye", .num_inputs = 0, .flags = kCreation | kNonDifferentiable, .meta = &creation_meta,
                       .cpu = &eye_cpu, .doc = "identity matrix"});

// The default generator is shared by every thread: each draw holds this lock for the whole
// call, so one call's numbers are one contiguous block of the stream.
std::mutex& default_generator_mutex() {
  static std::mutex m;
  return m;
}

void rand_cpu(const KernelArgs& a) {
  auto p = static_cast<uintptr_t>(a.attrs.get_int("generator"));
  std::unique_lock<std::mutex> lock;
  if (!p) lock = std::unique_lock<std::mutex>(default_generator_mutex());
  Generator& g = p ? *reinterpret_cast<Generator*>(p) : default_generator();
  const double lo = a.attrs.get_float("low"), hi = a.attrs.get_float("high");
  const std::string& kind = a.attrs.get_string("kind");
  const Tensor& out = a.outputs[0];
  const int64_t n = out.numel();
  std::vector<double> v(static_cast<size_t>(n));
  if (kind == "uniform") {
    for (auto& x : v) x = lo + (hi - lo) * g.next_double();
  } else if (kind == "normal") {
    for (int64_t i = 0; i < n; i += 2) {
      // Box-Muller: two normals from two uniforms.
      double u1 = g.next_double(), u2 = g.next_double();
      if (u1 < 1e-300) u1 = 1e-300;
      double r = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
      v[static_cast<size_t>(i)] = r * std::cos(th);
      if (i + 1 < n) v[static_cast<size_t>(i + 1)] = r * std::sin(th);
    }
  } else {  // integer in [lo, hi)
    const uint64_t range = static_cast<uint64_t>(hi - lo);
    for (auto& x : v) x = lo + static_cast<double>(g.next_u64() % range);
  }
  fill_with(out, [&](int64_t i) { return v[static_cast<size_t>(i)]; });
}
TPU_DEFINE_OP(random_op, {.name = "random", .num_inputs = 0, .flags = kCreation | kRandom | kNonDifferentiable,
                          .meta = &creation_meta, .cpu = &rand_cpu,
                          .doc = "uniform / normal / integer random numbers from a seedable generator"});

Attrs creation_attrs(const Shape& s, const TensorOptions& o, DType dflt = DType::f32) {
  return Attrs{{"shape", s.vec()}, {"dtype", o.dtype_or(dflt)}, {"device", o.device}};
}

void check_device(const Device& d) { device::driver_for(d); }

}  // namespace

void Generator::manual_seed(uint64_t seed) {
  seed_ = seed;
  state_ = seed;
}
uint64_t Generator::next_u64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
double Generator::next_double() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
// The default generator is shared by all threads and thread-safe through the lock above: each
// rand/randn/randint call draws one contiguous block of its stream, so one thread's results are
// determined by the seed; with several threads the set of blocks is fixed but which thread gets
// which follows the scheduling. Give each thread its own Generator for reproducible parallel
// code. Calling next_u64() on default_generator() directly from several threads is not safe.
Generator& default_generator() {
  static Generator g;
  return g;
}
void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(default_generator_mutex());
  default_generator().manual_seed(seed);
}

Tensor empty(const Shape& shape, TensorOptions o) {
  check_device(o.device);
  for (int i = 0; i < shape.ndim(); ++i)
    TPU_CHECK(shape[i] >= 0, "empty: negative dimension {} in shape {}", shape[i], shape.str());
  return ops::empty_tensor(shape, o.dtype_or(DType::f32), o.device);
}

Tensor full(const Shape& shape, Scalar value, TensorOptions o) {
  check_device(o.device);
  Attrs a = creation_attrs(shape, o, value.dtype());
  a.set("value", value);
  return ops::call(full_op(), {}, a);
}
Tensor zeros(const Shape& shape, TensorOptions o) { return full(shape, 0, TensorOptions(o.dtype_or(DType::f32), o.device)); }
Tensor ones(const Shape& shape, TensorOptions o) { return full(shape, 1, TensorOptions(o.dtype_or(DType::f32), o.device)); }
Tensor scalar_tensor(Scalar v, TensorOptions o) { return full(Shape{}, v, o); }

Tensor arange(Scalar end, TensorOptions o) { return arange(0, end, 1, o); }
Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions o) {
  const double s = start.to_double(), e = end.to_double(), st = step.to_double();
  TPU_CHECK(st != 0.0, "arange: step must be nonzero");
  TPU_CHECK(std::isfinite(s) && std::isfinite(e) && std::isfinite(st), "arange: start, end and step must be finite (got {}, {}, {})", s, e, st);
  TPU_CHECK((st > 0 && e >= s) || (st < 0 && e <= s),
            "arange: the range from {} to {} is not reachable with step {}", s, e, st);
  const double count = std::ceil((e - s) / st);
  TPU_CHECK(count <= static_cast<double>(kMaxNumel),
            "arange: the range from {} to {} with step {} has {:g} elements, more than the limit of {} (2^46) per "
            "tensor", s, e, st, count, kMaxNumel);
  const int64_t n = static_cast<int64_t>(count);
  check_device(o.device);
  const bool ints = start.is_integer() && end.is_integer() && step.is_integer();
  Attrs a = creation_attrs(Shape{n}, o, ints ? DType::i32 : DType::f32);
  a.set("start", s);
  a.set("step", st);
  return ops::call(arange_op(), {}, a);
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions o) {
  TPU_CHECK(steps >= 0, "linspace: number of steps must be non-negative, got {}", steps);
  check_device(o.device);
  Attrs a = creation_attrs(Shape{steps}, o);
  a.set("start", start);
  a.set("end", end);
  return ops::call(linspace_op(), {}, a);
}

Tensor eye(int64_t n, std::optional<int64_t> m, TensorOptions o) {
  const int64_t cols = m.value_or(n);
  TPU_CHECK(n >= 0 && cols >= 0, "eye: sizes must be non-negative, got n={} m={}", n, cols);
  check_device(o.device);
  return ops::call(eye_op(), {}, creation_attrs(Shape{n, cols}, o));
}

static Tensor random_tensor(const Shape& s, TensorOptions o, Generator* g, const char* kind, double lo, double hi) {
  check_device(o.device);
  Attrs a = creation_attrs(s, o);
  a.set("kind", std::string(kind));
  a.set("low", lo);
  a.set("high", hi);
  a.set("generator", static_cast<int64_t>(reinterpret_cast<uintptr_t>(g)));
  return ops::call(random_op(), {}, a);
}

Tensor rand(const Shape& shape, TensorOptions o, Generator* g) {
  TPU_CHECK(is_floating(o.dtype_or(DType::f32)), "rand: dtype must be floating, got {}", dtype_name(o.dtype_or(DType::f32)));
  return random_tensor(shape, o, g, "uniform", 0.0, 1.0);
}
Tensor randn(const Shape& shape, TensorOptions o, Generator* g) {
  TPU_CHECK(is_floating(o.dtype_or(DType::f32)), "randn: dtype must be floating, got {}", dtype_name(o.dtype_or(DType::f32)));
  return random_tensor(shape, o, g, "normal", 0.0, 1.0);
}
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions o, Generator* g) {
  TPU_CHECK(high > low, "randint: high ({}) must be greater than low ({})", high, low);
  return random_tensor(shape, TensorOptions(o.dtype_or(DType::i32), o.device), g, "integer", static_cast<double>(low),
                       static_cast<double>(high));
}
Tensor rand_like(const Tensor& t, Generator* g) { return rand(t.shape(), TensorOptions(t.dtype(), t.device()), g); }
Tensor randn_like(const Tensor& t, Generator* g) { return randn(t.shape(), TensorOptions(t.dtype(), t.device()), g); }

Tensor empty_like(const Tensor& t) { return empty(t.shape(), TensorOptions(t.dtype(), t.device())); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), TensorOptions(t.dtype(), t.device())); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), TensorOptions(t.dtype(), t.device())); }
Tensor full_like(const Tensor& t, Scalar v) { return full(t.shape(), v, TensorOptions(t.dtype(), t.device())); }

Tensor from_buffer(const void* data, DType src_dtype, const Shape& shape, TensorOptions o) {
  TPU_CHECK(data != nullptr || shape.numel() == 0, "from_buffer: null data pointer for shape {}", shape.str());
  for (int i = 0; i < shape.ndim(); ++i)
    TPU_CHECK(shape[i] >= 0, "from_buffer: negative dimension {} in shape {}", shape[i], shape.str());
  Tensor host = ops::empty_tensor(shape, src_dtype, Device());
  if (host.nbytes()) std::memcpy(host.raw_data(), data, host.nbytes());
  const DType dt = o.dtype_or(src_dtype);
  if (src_dtype != dt) host = to(host, dt);
  return to(host, o.device);
}

Tensor from_buffer_checked(const void* data, size_t count, DType src_dtype, const Shape& shape, TensorOptions o) {
  for (int i = 0; i < shape.ndim(); ++i)
    TPU_CHECK(shape[i] >= 0, "from_vector: negative dimension {} in shape {}", shape[i], shape.str());
  TPU_CHECK(static_cast<int64_t>(count) == shape.numel(),
            "from_vector: {} values given for shape {} ({} elements)", count, shape.str(), shape.numel());
  return from_buffer(data, src_dtype, shape, o);
}

Tensor& fill_(Tensor& self, Scalar v) {
  TPU_CHECK(self.defined(), "fill_: self is an undefined tensor");
  if (ops::InplaceHook h = ops::inplace_hook(); h && h("fill_", nullptr, self, {}, {{"value", v}})) return self;
  return copy_(self, full(Shape{}, v, TensorOptions(self.dtype(), Device())));
}

namespace detail {
void from_vector_out_of_i32(int64_t value, size_t index) {
  fail("from_vector: {} (element {}) does not fit the default integer dtype i32; pass TensorOptions(DType::i64) "
       "to keep 64-bit integers",
       value, index);
}
}  // namespace detail

}  // namespace tpu
