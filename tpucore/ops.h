/// @file
/// The public op API. Every function here is one registered op (or a thin composition of
/// them) and runs on the device of its inputs. Semantics follow PyTorch unless stated.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu {

/// A list of dimensions (negative ones count from the end).
using Dims = std::vector<int64_t>;

// ---------------- creation ----------------
/// dtype and device of a new tensor; converts implicitly from a DType, a Device or a device
/// string, so `tpu::zeros({2, 3}, tpu::DType::bf16)` and `tpu::ones({4}, "sim")` work.
/// dtype unset means the op's default: f32, or (arange, full) the kind of the given numbers.
struct TensorOptions {
  /// Element type; unset means the op's default.
  std::optional<DType> dtype;
  /// Device of the new tensor (cpu by default).
  Device device = Device();
  TensorOptions() = default;
  /// Only the dtype.
  TensorOptions(DType t) : dtype(t) {}
  /// Only the device.
  TensorOptions(Device d) : device(d) {}
  /// Only the device, parsed from a string ("sim:0"; a bad one is a tpu::Error).
  TensorOptions(const char* d) : device(d) {}
  /// Both.
  TensorOptions(DType t, Device d) : dtype(t), device(d) {}
  /// The dtype, or `d` when unset.
  DType dtype_or(DType d) const { return dtype.value_or(d); }
};

/// A new tensor of `shape`, its values uninitialized.
Tensor empty(const Shape& shape, TensorOptions o = {});
/// A new tensor of `shape` filled with 0.
Tensor zeros(const Shape& shape, TensorOptions o = {});
/// A new tensor of `shape` filled with 1.
Tensor ones(const Shape& shape, TensorOptions o = {});
/// A new tensor of `shape` filled with `value` (dtype by default from the value's kind).
Tensor full(const Shape& shape, Scalar value, TensorOptions o = {});
/// 0, 1, ..., up to but excluding `end` (1-D).
Tensor arange(Scalar end, TensorOptions o = {});
/// start, start + step, ..., up to but excluding `end`; step 0 is a tpu::Error.
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions o = {});
/// `steps` evenly spaced values from `start` to `end` inclusive.
Tensor linspace(double start, double end, int64_t steps, TensorOptions o = {});
/// An n x m (m defaults to n) matrix with ones on the diagonal.
Tensor eye(int64_t n, std::optional<int64_t> m = std::nullopt, TensorOptions o = {});
/// A 0-d tensor holding `v`.
Tensor scalar_tensor(Scalar v, TensorOptions o = {});
/// Copies host data (converted from T to o.dtype) into a new tensor of the given shape.
/// (double data defaults to f32, int64_t to i32; a size mismatch is a tpu::Error.)
Tensor from_buffer(const void* data, DType src_dtype, const Shape& shape, TensorOptions o);
/// A tensor of `shape` from host data (converted to o.dtype); the size must match the shape.
template <class T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape, TensorOptions o);
/// A tensor of `shape` from host data, dtype from T (double gives f32, int64_t gives i32: a value outside
/// i32 is a tpu::Error unless `o` asks for i64).
template <class T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape);
/// A 1-D tensor from host data, dtype from T as above.
template <class T>
Tensor from_vector(const std::vector<T>& data) { return from_vector(data, Shape{static_cast<int64_t>(data.size())}); }
/// from_buffer with the element count of `data` given: a count that does not match the shape is
/// a tpu::Error.
Tensor from_buffer_checked(const void* data, size_t count, DType src_dtype, const Shape& shape, TensorOptions o);
/// Uninitialized, with t's shape, dtype and device.
Tensor empty_like(const Tensor& t);
/// Zeros with t's shape, dtype and device.
Tensor zeros_like(const Tensor& t);
/// Ones with t's shape, dtype and device.
Tensor ones_like(const Tensor& t);
/// `v` everywhere, with t's shape, dtype and device.
Tensor full_like(const Tensor& t, Scalar v);

/// Random numbers from a seedable generator (the global one unless given).
class Generator {
 public:
  /// A generator seeded with `seed`.
  explicit Generator(uint64_t seed = 0x853c49e6748fea9bULL) { manual_seed(seed); }
  /// Restarts the stream from `seed`.
  void manual_seed(uint64_t seed);
  /// The seed last set.
  uint64_t seed() const { return seed_; }
  uint64_t next_u64();   ///< splitmix64 stream
  double next_double();  ///< uniform in [0, 1)
 private:
  uint64_t seed_ = 0, state_ = 0;
};
/// The global generator random ops use when none is given.
Generator& default_generator();
/// Seeds the global generator.
void manual_seed(uint64_t seed);
Tensor rand(const Shape& shape, TensorOptions o = {}, Generator* g = nullptr);   ///< U[0, 1)
Tensor randn(const Shape& shape, TensorOptions o = {}, Generator* g = nullptr);  ///< N(0, 1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions o = TensorOptions(DType::i32),
               Generator* g = nullptr);  ///< [low, high)
/// rand with t's shape, dtype and device.
Tensor rand_like(const Tensor& t, Generator* g = nullptr);
/// randn with t's shape, dtype and device.
Tensor randn_like(const Tensor& t, Generator* g = nullptr);

// ---------------- elementwise binary (broadcasting, type promotion) ----------------
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1);  ///< a + alpha * b
/// a - alpha * b.
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha = 1);
/// a * b.
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  ///< true division (ints promote to f32)
/// a to the power b.
Tensor pow(const Tensor& a, const Tensor& b);
/// Elementwise maximum (NaN propagates).
Tensor maximum(const Tensor& a, const Tensor& b);
/// Elementwise minimum (NaN propagates).
Tensor minimum(const Tensor& a, const Tensor& b);
/// Remainder of a / b with the sign of a (C's fmod).
Tensor fmod(const Tensor& a, const Tensor& b);
/// Comparisons a == b, a != b, a < b, a <= b, a > b, a >= b: bool results.
///@{
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
///@}
/// Logical and, or, xor of the truth values (nonzero is true): bool results.
///@{
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
///@}
/// a where cond is true, else b (all three broadcast).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// Tensor-scalar forms: the scalar is a wrapped number (lowest priority in promotion).
///@{
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);
Tensor pow(const Tensor& a, Scalar b);
Tensor maximum(const Tensor& a, Scalar b);
Tensor minimum(const Tensor& a, Scalar b);
Tensor fmod(const Tensor& a, Scalar b);
Tensor eq(const Tensor& a, Scalar b);
Tensor ne(const Tensor& a, Scalar b);
Tensor lt(const Tensor& a, Scalar b);
Tensor le(const Tensor& a, Scalar b);
Tensor gt(const Tensor& a, Scalar b);
Tensor ge(const Tensor& a, Scalar b);
Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
///@}
/// In-place forms (result cast to self's dtype; self must not need broadcasting).
Tensor where(const Tensor& cond, Scalar a, const Tensor& b);
/// A 0-d tensor made from a scalar that takes part in promotion as a wrapped number.
Tensor wrap_scalar(Scalar s);

/// In-place forms (result cast to self's dtype; self must not need broadcasting).
///@{
Tensor& add_(Tensor& self, const Tensor& b, Scalar alpha = 1);
Tensor& sub_(Tensor& self, const Tensor& b, Scalar alpha = 1);
Tensor& mul_(Tensor& self, const Tensor& b);
Tensor& div_(Tensor& self, const Tensor& b);
///@}
/// Sets every element of self to v.
Tensor& fill_(Tensor& self, Scalar v);
Tensor& copy_(Tensor& self, const Tensor& src);  ///< broadcasts src, converts dtype and device

// ---------------- unary ----------------
/// -x.
Tensor neg(const Tensor& x);
/// |x|.
Tensor abs(const Tensor& x);
/// -1, 0 or 1 by the sign of x.
Tensor sign(const Tensor& x);
/// e^x.
Tensor exp(const Tensor& x);
/// Natural logarithm.
Tensor log(const Tensor& x);
/// log(1 + x), accurate near 0.
Tensor log1p(const Tensor& x);
/// e^x - 1, accurate near 0.
Tensor expm1(const Tensor& x);
/// Square root.
Tensor sqrt(const Tensor& x);
/// 1 / sqrt(x).
Tensor rsqrt(const Tensor& x);
/// 1 / x.
Tensor reciprocal(const Tensor& x);
/// Sine (radians).
Tensor sin(const Tensor& x);
/// Cosine (radians).
Tensor cos(const Tensor& x);
/// Hyperbolic tangent.
Tensor tanh(const Tensor& x);
/// 1 / (1 + e^-x).
Tensor sigmoid(const Tensor& x);
/// max(x, 0).
Tensor relu(const Tensor& x);
/// x * Phi(x) (exact, with erf), or its tanh approximation when `tanh_approx`.
Tensor gelu(const Tensor& x, bool tanh_approx = false);
/// x * sigmoid(x).
Tensor silu(const Tensor& x);
/// The error function.
Tensor erf(const Tensor& x);
/// Rounds down.
Tensor floor(const Tensor& x);
/// Rounds up.
Tensor ceil(const Tensor& x);
Tensor round(const Tensor& x);  ///< half to even
/// x limited to [min, max] (either bound may be absent).
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max);
/// True where x is zero (bool result).
Tensor logical_not(const Tensor& x);
/// True where x is NaN (bool result).
Tensor isnan(const Tensor& x);
/// relu in place.
Tensor& relu_(Tensor& x);

// ---------------- reductions (dims empty = all dims) ----------------
/// Sum over `dims` (all when empty); `dtype` sets the accumulation and result type.
Tensor sum(const Tensor& x, const Dims& dims = {}, bool keepdim = false, std::optional<DType> dtype = std::nullopt);
/// Mean over `dims` (floating point input).
Tensor mean(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
/// Product over `dims`.
Tensor prod(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
/// Largest value over `dims`.
Tensor amax(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
/// Smallest value over `dims`.
Tensor amin(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
/// max/min over one dim return (values, indices) like PyTorch (indices i64, as argmax/argmin).
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
/// (values, indices) of the minimum over `dim`.
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  ///< of all elements
/// Smallest element.
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);  ///< i64
/// Index of the smallest element (over `dim`, or of the flattened tensor); i64.
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
/// Variance over `dims`, dividing by N - correction.
Tensor var(const Tensor& x, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false);
/// Standard deviation over `dims`, dividing by N - correction.
Tensor std(const Tensor& x, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false);
/// log(sum(exp(x))) over `dims`, computed stably.
Tensor logsumexp(const Tensor& x, const Dims& dims, bool keepdim = false);
/// True when every element over `dims` is nonzero (bool).
Tensor all(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
/// True when some element over `dims` is nonzero (bool).
Tensor any(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
/// exp(x) / sum(exp(x)) along `dim`.
Tensor softmax(const Tensor& x, int64_t dim);
/// log(softmax(x)) along `dim`, computed stably.
Tensor log_softmax(const Tensor& x, int64_t dim);

// ---------------- normalization ----------------
/// Normalizes over the trailing dims given by normalized_shape; weight/bias optional.
/// (x - mean) / sqrt(var + eps) * weight + bias over the trailing `normalized_shape` dims.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {}, const Tensor& bias = {},
                  double eps = 1e-5);
/// x / sqrt(mean(x^2) + eps) * weight over the trailing dims; eps unset: f32's machine epsilon.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                std::optional<double> eps = std::nullopt);

// ---------------- attention ----------------
/// softmax(q k^T * scale + mask) v, as PyTorch's F.scaled_dot_product_attention (no dropout) with
/// enable_gqa: q [..., Hq, Lq, D], k [..., Hk, Lk, D], v [..., Hk, Lk, Dv] -> [..., Hq, Lq, Dv];
/// Hq a multiple of Hk (query head h reads KV head h / (Hq / Hk)). attn_mask: optional bool,
/// true = takes part, broadcast to [..., Hq, Lq, Lk]. is_causal masks key j > query i. scale
/// defaults to 1 / sqrt(D). On sim it runs as one fused kernel (scores never leave VMEM).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask = {},
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);
/// Rotary position embedding (RoPE, Hugging Face's rotate_half form): x cos + rotate_half(x) sin
/// with rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]); x [..., D] with D even, cos/sin
/// broadcast to x (e.g. [T, D] against [B, H, T, D]). One pass on sim.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);

// ---------------- linear algebra ----------------
Tensor matmul(const Tensor& a, const Tensor& b);  ///< 1-D/2-D/batched with broadcasting, as PyTorch
Tensor mm(const Tensor& a, const Tensor& b);      ///< 2-D only
Tensor bmm(const Tensor& a, const Tensor& b);     ///< 3-D only, same batch
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});  ///< x W^T + b

// ---------------- views and shape ----------------
Tensor reshape(const Tensor& x, const Shape& shape);  ///< one dim may be -1; copies only if needed
Tensor view(const Tensor& x, const Shape& shape);     ///< never copies; error if strides forbid
/// The view with dims reordered: result dim i is x's dim dims[i].
Tensor permute(const Tensor& x, const Shape& dims);
/// The view with dims d0 and d1 swapped.
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
/// Drops size-1 dims (only `dim` when given).
Tensor squeeze(const Tensor& x, std::optional<int64_t> dim = std::nullopt);
/// Inserts a size-1 dim at `dim`.
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor expand(const Tensor& x, const Shape& shape);  ///< -1 keeps a dim
/// Merges dims start_dim..end_dim into one.
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);  ///< clamps like Python
/// The view of `length` elements from `start` along `dim`.
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
/// The view at `index` along `dim` (that dim removed).
Tensor select(const Tensor& x, int64_t dim, int64_t index);
/// x itself when contiguous, else a contiguous copy.
Tensor contiguous(const Tensor& x);
/// A contiguous copy.
Tensor clone(const Tensor& x);
/// Joins tensors along an existing dim.
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
/// Joins same-shaped tensors along a new dim.
Tensor stack(const std::vector<Tensor>& xs, int64_t dim = 0);
/// Views of `split_size` elements along `dim` (the last may be smaller).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
/// Views of the given sizes along `dim` (they must sum to its size).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
/// At most `chunks` views of equal size (the last may be smaller) along `dim`.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// ---------------- indexing ----------------
/// The entries of x at integer positions `index` (1-D) along `dim`.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// out[i][j] = x[index[i][j]][j] (for dim 0), as torch.gather.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
/// A copy of x with src added at the positions `index` along `dim`, as torch.scatter_add.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
/// Rows of `weight` [num, dim] at integer `indices` [...]: [..., dim].
Tensor embedding(const Tensor& weight, const Tensor& indices);
/// x with `value` where the bool `mask` (broadcast) is true.
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);
/// The lower triangle of the last two dims (above diagonal `diagonal` set to 0).
Tensor tril(const Tensor& x, int64_t diagonal = 0);
/// The upper triangle of the last two dims (below diagonal `diagonal` set to 0).
Tensor triu(const Tensor& x, int64_t diagonal = 0);
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);  ///< i64 output (as PyTorch)

// ---------------- cast and move ----------------
/// x converted to `dtype` (x itself when it already is).
Tensor to(const Tensor& x, DType dtype);
/// x copied to `device` (x itself when already there).
Tensor to(const Tensor& x, Device device);
/// True when |a - b| <= atol + rtol |b| everywhere (shapes broadcast).
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
bool equal(const Tensor& a, const Tensor& b);  ///< same shape and values

// ---------------- operators ----------------
/// Arithmetic operators: add, sub, mul, div (tensor or scalar on either side; `-x` is neg).
///@{
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
inline Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
inline Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
inline Tensor operator-(Scalar a, const Tensor& b) { return add(neg(b), a); }
inline Tensor operator/(Scalar a, const Tensor& b) { return div(wrap_scalar(a), b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
///@}
/// Comparison operators: eq, ne, lt, le, gt, ge (bool results).
///@{
inline Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
inline Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
inline Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
inline Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
inline Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
inline Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
///@}
/// Compound assignment: the in-place add_, sub_, mul_, div_.
///@{
inline Tensor& operator+=(Tensor& a, const Tensor& b) { return add_(a, b); }
inline Tensor& operator-=(Tensor& a, const Tensor& b) { return sub_(a, b); }
inline Tensor& operator*=(Tensor& a, const Tensor& b) { return mul_(a, b); }
inline Tensor& operator/=(Tensor& a, const Tensor& b) { return div_(a, b); }
///@}

namespace detail {
/// Throws the tpu::Error of a 64-bit value that the default i32 dtype cannot hold.
[[noreturn]] void from_vector_out_of_i32(int64_t value, size_t index);
template <class T>
Tensor from_vector_impl(const std::vector<T>& data, const Shape& shape, TensorOptions o) {
  if constexpr (std::is_same_v<T, double>) {
    std::vector<float> f(data.begin(), data.end());
    return from_buffer_checked(f.data(), f.size(), DType::f32, shape, o);
  } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, long long>) {
    // 64-bit ints default to i32 (our default integer type); asking for i64 keeps all 64 bits.
    if (o.dtype == DType::i64) return from_buffer_checked(data.data(), data.size(), DType::i64, shape, o);
    std::vector<int32_t> f(data.size());
    for (size_t i = 0; i < data.size(); ++i) {
      const int64_t v = static_cast<int64_t>(data[i]);
      if (v < INT32_MIN || v > INT32_MAX) from_vector_out_of_i32(v, i);
      f[i] = static_cast<int32_t>(v);
    }
    return from_buffer_checked(f.data(), f.size(), DType::i32, shape, o);
  } else if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> f(data.begin(), data.end());
    return from_buffer_checked(f.data(), f.size(), DType::boolean, shape, o);
  } else {
    return from_buffer_checked(data.data(), data.size(), dtype_of<T>::value, shape, o);
  }
}
template <class T>
constexpr DType default_dtype_for() {
  if constexpr (std::is_same_v<T, double>) return DType::f32;
  else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, long long>) return DType::i32;
  else return dtype_of<T>::value;
}
}  // namespace detail

template <class T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape, TensorOptions o) {
  return detail::from_vector_impl(data, shape, o);
}
template <class T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape) {
  return detail::from_vector_impl(data, shape, TensorOptions(detail::default_dtype_for<T>()));
}

}  // namespace tpu
