// The Tensor methods that read values (item, to_vector, str): they move data with ops, so they
// live in the ops layer rather than with the core types.
#include <cmath>
#include <cstring>

#include "tpucore/core/hooks.h"
#include "tpucore/ops.h"

namespace tpu {

Scalar Tensor::item() const {
  TPU_CHECK(numel() == 1, "item: expected a tensor with one element, got shape {} ({} elements)", shape().str(),
            numel());
  Tensor h = tpu::to(is_proxy() ? detail::materialize_proxy(*this, "item()") : *this, Device());
  return dispatch_any_dtype(dtype(), [&](auto z) -> Scalar {
    using T = decltype(z);
    T v = *static_cast<const T*>(h.raw_data());
    if constexpr (std::is_same_v<T, bool>) return Scalar(v);
    else if constexpr (std::is_integral_v<T>) return Scalar(static_cast<long long>(v));
    else return Scalar(static_cast<double>(static_cast<float>(v)));
  });
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  const Tensor& self = is_proxy() ? detail::materialize_proxy(*this, "to_vector()") : *this;
  Tensor h = tpu::contiguous(tpu::to(tpu::to(self, Device()), dtype_of<T>::value));
  std::vector<T> v(static_cast<size_t>(h.numel()));
  if (!v.empty()) std::memcpy(v.data(), h.raw_data(), v.size() * sizeof(T));
  return v;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int8_t> Tensor::to_vector<int8_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
template std::vector<bf16> Tensor::to_vector<bf16>() const;
template std::vector<f16> Tensor::to_vector<f16>() const;
template std::vector<f8e4m3> Tensor::to_vector<f8e4m3>() const;
template std::vector<f8e5m2> Tensor::to_vector<f8e5m2>() const;

template <>
std::vector<bool> Tensor::to_vector<bool>() const {
  std::vector<uint8_t> u = tpu::to(*this, DType::u8).to_vector<uint8_t>();
  return std::vector<bool>(u.begin(), u.end());
}

// ---------------- printing ----------------
namespace {

constexpr int64_t kSummarizeThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

struct Printer {
  const std::vector<double>& v;
  Shape shape, strides;
  bool summarize;
  DType dtype;
  std::string mode;  // "int", "fixed", "sci", "bool"
  int width = 1;

  std::string fmt_one(double x) const {
    if (mode == "bool") return x != 0 ? "True" : "False";
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    if (mode == "int") return fmt::format("{}", static_cast<long long>(x));
    if (mode == "intf") return fmt::format("{:.0f}.", x);
    if (mode == "sci") return fmt::format("{:.4e}", x);
    return fmt::format("{:.4f}", x);
  }
  void rec(std::string& out, int d, int64_t base, int indent) const {
    if (d == shape.ndim()) {
      std::string s = fmt_one(v[static_cast<size_t>(base)]);
      out.append(static_cast<size_t>(std::max<int>(0, width - static_cast<int>(s.size()))), ' ');
      out += s;
      return;
    }
    out += "[";
    const int64_t n = shape[d];
    const bool last = d == shape.ndim() - 1;
    for (int64_t i = 0; i < n; ++i) {
      if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
        if (last) {
          out += "..., ";
        } else {
          out += "...,\n";
          out.append(static_cast<size_t>(indent + 1), ' ');
        }
        i = n - kEdgeItems;
      }
      rec(out, d + 1, base + i * strides[d], indent + 1);
      if (i + 1 < n) {
        if (last) out += ", ";
        else {
          out += ',';
          out.append(static_cast<size_t>(shape.ndim() - d - 1), '\n');
          out.append(static_cast<size_t>(indent + 1), ' ');
        }
      }
    }
    out += "]";
  }
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  if (is_proxy() && detail::proxy_deferred(*this)) return detail::materialize_proxy(*this, "printing").str();
  if (is_proxy()) return fmt::format("tensor(<traced>, shape={}, dtype={}, device='{}')", shape().str(), dtype_name(dtype()),
                                     device().str());
  Tensor h = tpu::contiguous(tpu::to(tpu::to(*this, Device()), DType::f32));
  std::vector<double> vals;
  vals.reserve(static_cast<size_t>(h.numel()));
  const float* p = h.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i) vals.push_back(p[i]);
  Printer pr{vals, shape(), contiguous_strides(shape()), numel() > kSummarizeThreshold, dtype(), "fixed"};
  if (dtype() == DType::boolean) pr.mode = "bool";
  else if (is_integral(dtype())) pr.mode = "int";
  else {
    bool all_int = true;
    double amax = 0, amin_nz = INFINITY;
    for (double x : vals) {
      if (!std::isfinite(x)) continue;
      if (x != std::floor(x)) all_int = false;
      amax = std::max(amax, std::fabs(x));
      if (x != 0) amin_nz = std::min(amin_nz, std::fabs(x));
    }
    if (amax >= 1e8 || (amin_nz < 1e-4 && !all_int) || (amax / amin_nz > 1e4 && !all_int)) pr.mode = "sci";
    else if (all_int) pr.mode = "intf";
  }
  for (double x : vals) pr.width = std::max<int>(pr.width, static_cast<int>(pr.fmt_one(x).size()));
  std::string out = "tensor(";
  if (numel() == 0) {
    out += "[]";
    if (dim() != 1) out += fmt::format(", size={}", shape().str());
  } else {
    pr.rec(out, 0, 0, 7);
  }
  if (dtype() != DType::f32 && dtype() != DType::boolean && !(dtype() == DType::i32 && numel() > 0))
    out += fmt::format(", dtype={}", dtype_name(dtype()));
  if (!device().is_cpu()) out += fmt::format(", device='{}'", device().str());
  out += ")";
  return out;
}

}  // namespace tpu
