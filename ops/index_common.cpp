#include "ops/index_common.h"

#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>

namespace tpu::ops::indexing {

void check_index_dtype(const char* op, const char* arg, const Tensor& index) {
  const DType t = index.dtype();
  TPU_CHECK(t == DType::i32 || t == DType::i64 || t == DType::i8 || t == DType::u8,
            "{}: {} must be an integer tensor (i64, i32, i8 or u8), got {} of shape {}", op, arg, dtype_name(t),
            index.shape().str());
  // i64 indices run as i32: a value outside i32 would wrap into a wrong but valid index, so
  // host indices are checked here (no tensor dim reaches 2^31 elements).
  if (t != DType::i64 || index.is_proxy() || !index.device().is_cpu() || !index.storage() || index.numel() == 0) return;
  std::atomic<bool> bad{false};
  std::atomic<int64_t> bad_value{0};
  std::array<char*, 1> base{cpu::byte_ptr(index)};
  std::array<Shape, 1> st{byte_strides(index)};
  cpu::for_each_run<1>(index.shape(), base, st, [&](std::array<char*, 1> p, std::array<int64_t, 1> s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t v;
      std::memcpy(&v, p[0] + i * s[0], sizeof v);
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) [[unlikely]] {
        bad_value.store(v);
        bad.store(true);
        return;
      }
    }
  });
  if (bad.load())
    fail("{}: {} holds the value {}, out of range for any dim (shape {})", op, arg, bad_value.load(),
         index.shape().str());
}

Shape byte_strides(const Tensor& t) {
  Shape s = t.strides();
  const auto es = static_cast<int64_t>(t.element_size());
  for (int i = 0; i < s.ndim(); ++i) s[i] *= es;
  return s;
}

void check_index_range(const char* op, const Tensor& index, int64_t size, int64_t dim, const std::string& what) {
  if (index.numel() == 0) return;
  std::atomic<bool> bad{false};
  std::mutex mu;
  int32_t bad_value = 0;
  std::array<char*, 1> base{cpu::byte_ptr(index)};
  std::array<Shape, 1> st{byte_strides(index)};
  cpu::for_each_run<1>(index.shape(), base, st, [&](std::array<char*, 1> p, std::array<int64_t, 1> s, int64_t n) {
    if (bad.load(std::memory_order_relaxed)) return;
    const char* q = p[0];
    for (int64_t i = 0; i < n; ++i) {
      int32_t v;
      std::memcpy(&v, q + i * s[0], sizeof v);
      if (v < 0 || v >= size) [[unlikely]] {
        std::lock_guard<std::mutex> lk(mu);
        if (!bad.load()) {
          bad_value = v;
          bad.store(true);
        }
        return;
      }
    }
  });
  if (bad.load())
    fail("{}: index {} is out of range for dim {} with size {} ({}){}", op, bad_value, dim, size, what,
         bad_value < 0 ? "; negative indices are not supported" : "");
}

std::vector<int32_t> read_indices(const Tensor& index) {
  std::vector<int32_t> v(static_cast<size_t>(index.numel()));
  if (v.empty()) return v;
  const char* src = cpu::byte_ptr(index);
  if (index.is_contiguous()) {
    std::memcpy(v.data(), src, v.size() * sizeof(int32_t));
    return v;
  }
  Shape dst = contiguous_strides(index.shape());
  for (int i = 0; i < dst.ndim(); ++i) dst[i] *= static_cast<int64_t>(sizeof(int32_t));
  BlockCopy copy(index.shape(), dst, byte_strides(index), sizeof(int32_t));
  copy(reinterpret_cast<char*>(v.data()), src);
  return v;
}

BlockCopy::BlockCopy(const Shape& shape, const Shape& dst_strides, const Shape& src_strides, size_t es)
    : L_(cpu::coalesce<2>(shape, std::array<Shape, 2>{dst_strides, src_strides})), es_(es), numel_(shape.numel()) {}

namespace {
template <size_t ES>
inline void copy_elems(char* d, int64_t ds, const char* s, int64_t ss, int64_t n) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * ds, s + i * ss, ES);
}
}  // namespace

void copy_elements(char* d, int64_t ds, const char* s, int64_t ss, int64_t n, size_t es) {
  const auto e = static_cast<int64_t>(es);
  if (ds == e && ss == e) {
    std::memcpy(d, s, static_cast<size_t>(n) * es);
    return;
  }
  switch (es) {
    case 1: copy_elems<1>(d, ds, s, ss, n); break;
    case 2: copy_elems<2>(d, ds, s, ss, n); break;
    case 4: copy_elems<4>(d, ds, s, ss, n); break;
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * ds, s + i * ss, es);
  }
}

void BlockCopy::operator()(char* dst, const char* src) const {
  if (numel_ == 0) return;
  const int nd = L_.ndim;
  const int64_t inner = L_.sizes[nd - 1];
  const int64_t ids = L_.strides[0][nd - 1], iss = L_.strides[1][nd - 1];
  if (nd == 1) {
    copy_elements(dst, ids, src, iss, inner, es_);
    return;
  }
  int64_t idx[kMaxDims] = {};
  const int64_t rows = numel_ / inner;
  for (int64_t r = 0; r < rows; ++r) {
    copy_elements(dst, ids, src, iss, inner, es_);
    for (int d = nd - 2; d >= 0; --d) {
      dst += L_.strides[0][d];
      src += L_.strides[1][d];
      if (++idx[d] < L_.sizes[d]) break;
      dst -= L_.strides[0][d] * L_.sizes[d];
      src -= L_.strides[1][d] * L_.sizes[d];
      idx[d] = 0;
    }
  }
}

void strided_copy(const Shape& shape, char* dst, const Shape& dst_strides, const char* src, const Shape& src_strides,
                  size_t es) {
  std::array<char*, 2> base{dst, const_cast<char*>(src)};
  std::array<Shape, 2> st{dst_strides, src_strides};
  cpu::for_each_run<2>(shape, base, st, [es](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
    copy_elements(p[0], s[0], p[1], s[1], n, es);
  });
}

}  // namespace tpu::ops::indexing
