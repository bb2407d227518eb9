// The public op API. Every function here is one registered op (or a thin composition of
// them) and runs on the device of its inputs. Semantics follow PyTorch unless stated.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu {

using Dims = std::vector<int64_t>;

// ---------------- creation ----------------
// dtype unset means the op's default: f32, or (arange, full) the kind of the given numbers.
struct TensorOptions {
  std::optional<DType> dtype;
  Device device = Device();
  TensorOptions() = default;
  TensorOptions(DType t) : dtype(t) {}
  TensorOptions(Device d) : device(d) {}
  TensorOptions(const char* d) : device(d) {}
  TensorOptions(DType t, Device d) : dtype(t), device(d) {}
  DType dtype_or(DType d) const { return dtype.value_or(d); }
};

Tensor empty(const Shape& shape, TensorOptions o = {});
Tensor zeros(const Shape& shape, TensorOptions o = {});
Tensor ones(const Shape& shape, TensorOptions o = {});
Tensor full(const Shape& shape, Scalar value, TensorOptions o = {});
Tensor arange(Scalar end, TensorOptions o = {});
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions o = {});
Tensor linspace(double start, double end, int64_t steps, TensorOptions o = {});
Tensor eye(int64_t n, std::optional<int64_t> m = std::nullopt, TensorOptions o = {});
Tensor scalar_tensor(Scalar v, TensorOptions o = {});
// Copies host data (converted from T to o.dtype) into a new tensor of the given shape.
// (double data defaults to f32, int64_t to i32; a size mismatch is a tpu::Error.)
Tensor from_buffer(const void* data, DType src_dtype, const Shape& shape, TensorOptions o);
template <class T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape, TensorOptions o);
template <class T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape);
template <class T>
Tensor from_vector(const std::vector<T>& data) { return from_vector(data, Shape{static_cast<int64_t>(data.size())}); }
Tensor from_buffer_checked(const void* data, size_t count, DType src_dtype, const Shape& shape, TensorOptions o);
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, Scalar v);

// Random numbers from a seedable generator (the global one unless given).
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x853c49e6748fea9bULL) { manual_seed(seed); }
  void manual_seed(uint64_t seed);
  uint64_t seed() const { return seed_; }
  uint64_t next_u64();   // splitmix64 stream
  double next_double();  // uniform in [0, 1)
 private:
  uint64_t seed_ = 0, state_ = 0;
};
Generator& default_generator();
void manual_seed(uint64_t seed);
Tensor rand(const Shape& shape, TensorOptions o = {}, Generator* g = nullptr);   // U[0, 1)
Tensor randn(const Shape& shape, TensorOptions o = {}, Generator* g = nullptr);  // N(0, 1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions o = TensorOptions(DType::i32),
               Generator* g = nullptr);  // [low, high)
Tensor rand_like(const Tensor& t, Generator* g = nullptr);
Tensor randn_like(const Tensor& t, Generator* g = nullptr);

// ---------------- elementwise binary (broadcasting, type promotion) ----------------
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha = 1);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // true division (ints promote to f32)
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor fmod(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Tensor-scalar forms: the scalar is a wrapped number (lowest priority in promotion).
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
Tensor where(const Tensor& cond, Scalar a, const Tensor& b);
// A 0-d tensor made from a scalar that takes part in promotion as a wrapped number.
Tensor wrap_scalar(Scalar s);

// In-place forms (result cast to self's dtype; self must not need broadcasting).
Tensor& add_(Tensor& self, const Tensor& b, Scalar alpha = 1);
Tensor& sub_(Tensor& self, const Tensor& b, Scalar alpha = 1);
Tensor& mul_(Tensor& self, const Tensor& b);
Tensor& div_(Tensor& self, const Tensor& b);
Tensor& fill_(Tensor& self, Scalar v);
Tensor& copy_(Tensor& self, const Tensor& src);  // broadcasts src, converts dtype and device

// ---------------- unary ----------------
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor expm1(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approx = false);
Tensor silu(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor round(const Tensor& x);  // half to even
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max);
Tensor logical_not(const Tensor& x);
Tensor isnan(const Tensor& x);
Tensor& relu_(Tensor& x);

// ---------------- reductions (dims empty = all dims) ----------------
Tensor sum(const Tensor& x, const Dims& dims = {}, bool keepdim = false, std::optional<DType> dtype = std::nullopt);
Tensor mean(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor prod(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
// max/min over one dim return (values, indices) like PyTorch (indices i64, as argmax/argmin).
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // of all elements
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);  // i64
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor var(const Tensor& x, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& x, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const Dims& dims, bool keepdim = false);
Tensor all(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor any(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// ---------------- normalization ----------------
// Normalizes over the trailing dims given by normalized_shape; weight/bias optional.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {}, const Tensor& bias = {},
                  double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                std::optional<double> eps = std::nullopt);

// ---------------- attention ----------------
// softmax(q k^T * scale + mask) v, as PyTorch's F.scaled_dot_product_attention (no dropout) with
// enable_gqa: q [..., Hq, Lq, D], k [..., Hk, Lk, D], v [..., Hk, Lk, Dv] -> [..., Hq, Lq, Dv];
// Hq a multiple of Hk (query head h reads KV head h / (Hq / Hk)). attn_mask: optional bool,
// true = takes part, broadcast to [..., Hq, Lq, Lk]. is_causal masks key j > query i. scale
// defaults to 1 / sqrt(D). On sim it runs as one fused kernel (scores never leave VMEM).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask = {},
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);
// Rotary position embedding (RoPE, Hugging Face's rotate_half form): x cos + rotate_half(x) sin
// with rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]); x [..., D] with D even, cos/sin
// broadcast to x (e.g. [T, D] against [B, H, T, D]). One pass on sim.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);

// ---------------- linear algebra ----------------
Tensor matmul(const Tensor& a, const Tensor& b);  // 1-D/2-D/batched with broadcasting, as PyTorch
Tensor mm(const Tensor& a, const Tensor& b);      // 2-D only
Tensor bmm(const Tensor& a, const Tensor& b);     // 3-D only, same batch
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});  // x W^T + b

// ---------------- views and shape ----------------
Tensor reshape(const Tensor& x, const Shape& shape);  // one dim may be -1; copies only if needed
Tensor view(const Tensor& x, const Shape& shape);     // never copies; error if strides forbid
Tensor permute(const Tensor& x, const Shape& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor squeeze(const Tensor& x, std::optional<int64_t> dim = std::nullopt);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor expand(const Tensor& x, const Shape& shape);  // -1 keeps a dim
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);  // clamps like Python
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor contiguous(const Tensor& x);
Tensor clone(const Tensor& x);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// ---------------- indexing ----------------
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);  // i64 output (as PyTorch)

// ---------------- cast and move ----------------
Tensor to(const Tensor& x, DType dtype);
Tensor to(const Tensor& x, Device device);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
bool equal(const Tensor& a, const Tensor& b);  // same shape and values

// ---------------- operators ----------------
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
inline Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
inline Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
inline Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
inline Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
inline Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
inline Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
inline Tensor& operator+=(Tensor& a, const Tensor& b) { return add_(a, b); }
inline Tensor& operator-=(Tensor& a, const Tensor& b) { return sub_(a, b); }
inline Tensor& operator*=(Tensor& a, const Tensor& b) { return mul_(a, b); }
inline Tensor& operator/=(Tensor& a, const Tensor& b) { return div_(a, b); }

namespace detail {
template <class T>
Tensor from_vector_impl(const std::vector<T>& data, const Shape& shape, TensorOptions o) {
  if constexpr (std::is_same_v<T, double>) {
    std::vector<float> f(data.begin(), data.end());
    return from_buffer_checked(f.data(), f.size(), DType::f32, shape, o);
  } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, long long>) {
    // 64-bit ints default to i32 (our default integer type); asking for i64 keeps all 64 bits.
    if (o.dtype == DType::i64) return from_buffer_checked(data.data(), data.size(), DType::i64, shape, o);
    std::vector<int32_t> f(data.size());
    for (size_t i = 0; i < data.size(); ++i) f[i] = static_cast<int32_t>(data[i]);
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
