// Call signatures of compiled functions. First the mode: bit 0 the grad mode (tracing records
// autograd nodes only when it is on), bit 1 emulate_precision_casts (a graph compiled without it
// is never reused with it, and back); then per argument a few integers:
//   tensor:      [1, ndim, dims..., dtype, device, requires_grad, contiguous]
//   tensor list: [2, length, then each tensor as above without the leading 1]
//   number:      [3, kind]            (a runtime input: its value is not in the key)
//   static num.: [4, bits of the value]
//   other:       [5, hash]
// Building and hashing it allocates nothing once the vector has grown (the hit path).
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>

#include "tpucore/autograd.h"
#include "tpucore/jit/internal.h"

namespace tpu::jit::detail {
namespace {

int64_t device_code(const Device& d) { return static_cast<int64_t>(d.type) * 65536 + d.index; }
std::string device_name(int64_t c) { return Device(static_cast<DeviceType>(c / 65536), static_cast<int>(c % 65536)).str(); }

void put_tensor(const Tensor& t, int arg, const SigOptions& o, std::vector<int64_t>& sig) {
  TPU_CHECK(t.defined(), "compile: argument {} is an undefined tensor", arg);
  const int nd = t.dim();
  sig.push_back(nd);
  const size_t at = sig.size();
  for (int d = 0; d < nd; ++d) sig.push_back(t.shape()[d]);
  if (o.dynamic)
    for (const DynamicDim& dd : *o.dynamic)
      if (dd.arg == arg && nd > 0) {
        int d = dd.dim < 0 ? dd.dim + nd : dd.dim;
        if (d >= 0 && d < nd) sig[at + static_cast<size_t>(d)] = bucket_size(t.shape()[d]);
      }
  sig.push_back(static_cast<int64_t>(t.dtype()));
  sig.push_back(device_code(t.device()));
  sig.push_back(t.impl().requires_grad ? 1 : 0);
  sig.push_back(t.is_contiguous() ? 1 : 0);  // the trace follows eager's aliasing, which depends on it
}

}  // namespace

std::atomic<bool>& emulate_default() {
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("TPU_EMULATE_PRECISION_CASTS");
    if (!e || !*e) return false;
    const std::string v = e;
    TPU_CHECK(v == "0" || v == "1", "TPU_EMULATE_PRECISION_CASTS must be 0 or 1, got '{}'", v);
    return v == "1";
  }()};
  return on;
}

int64_t bucket_size(int64_t n) { return n <= 1 ? 1 : static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(n))); }

bool resolve_emulate(int option) { return option < 0 ? emulate_default().load() : option != 0; }

void build_signature(std::span<const ArgSlot> args, const SigOptions& o, std::vector<int64_t>& sig) {
  sig.clear();
  sig.push_back((is_grad_enabled() ? 1 : 0) | (o.emulate ? 2 : 0));
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSlot& a = args[i];
    switch (a.kind) {
      case ArgSlot::Kind::tensor:
        sig.push_back(1);
        put_tensor(*a.tensor, static_cast<int>(i), o, sig);
        break;
      case ArgSlot::Kind::tensor_list:
        sig.push_back(2);
        sig.push_back(static_cast<int64_t>(a.list->size()));
        for (const Tensor& t : *a.list) put_tensor(t, static_cast<int>(i), SigOptions{o.static_args, nullptr}, sig);
        break;
      case ArgSlot::Kind::number: {
        const bool is_static = a.boolean || (i < o.static_args->size() && (*o.static_args)[i]);
        if (is_static) {
          int64_t bits;
          std::memcpy(&bits, &a.number, 8);
          sig.push_back(4);
          sig.push_back(bits);
        } else {
          sig.push_back(3);
          sig.push_back(a.integral ? 1 : 0);
        }
        break;
      }
      case ArgSlot::Kind::other:
        sig.push_back(5);
        sig.push_back(static_cast<int64_t>(a.other_hash));
        break;
    }
  }
}

uint64_t hash_signature(const std::vector<int64_t>& sig) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ sig.size();
  for (int64_t v : sig) {
    h ^= static_cast<uint64_t>(v) + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
  }
  return h;
}

namespace {

struct Reader {
  const std::vector<int64_t>& s;
  size_t p = 0;
  bool done() const { return p >= s.size(); }
  int64_t next() { return p < s.size() ? s[p++] : -1; }
};

struct TensorDesc {
  Shape shape;
  int64_t dtype = 0, device = 0, grad = 0, contiguous = 0;
};
TensorDesc read_tensor(Reader& r) {
  TensorDesc t;
  int64_t nd = r.next();
  for (int64_t i = 0; i < nd && i < kMaxDims; ++i) t.shape.push_back(r.next());
  t.dtype = r.next();
  t.device = r.next();
  t.grad = r.next();
  t.contiguous = r.next();
  return t;
}
std::string diff_tensor(const std::string& what, const TensorDesc& a, const TensorDesc& b) {
  if (a.shape != b.shape) return fmt::format("{} shape {} -> {}", what, a.shape.str(), b.shape.str());
  if (a.dtype != b.dtype)
    return fmt::format("{} dtype {} -> {}", what, dtype_name(static_cast<DType>(a.dtype)), dtype_name(static_cast<DType>(b.dtype)));
  if (a.device != b.device) return fmt::format("{} device {} -> {}", what, device_name(a.device), device_name(b.device));
  if (a.grad != b.grad) return fmt::format("{} requires_grad {} -> {}", what, a.grad != 0, b.grad != 0);
  if (a.contiguous != b.contiguous)
    return fmt::format("{} layout {} -> {}", what, a.contiguous ? "contiguous" : "strided", b.contiguous ? "contiguous" : "strided");
  return "";
}
double bits_to_double(int64_t b) {
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}

}  // namespace

std::string describe_change(const std::vector<int64_t>& before, const std::vector<int64_t>& now) {
  Reader a{before}, b{now};
  const int64_t ga = a.next(), gb = b.next();
  if ((ga & 1) != (gb & 1)) return fmt::format("grad mode {} -> {}", ga & 1 ? "on" : "off", gb & 1 ? "on" : "off");
  if (ga != gb)
    return fmt::format("emulate_precision_casts {} -> {}", ga & 2 ? "on" : "off", gb & 2 ? "on" : "off");
  for (int arg = 0; !a.done() || !b.done(); ++arg) {
    const int64_t ka = a.next(), kb = b.next();
    if (ka != kb) return fmt::format("arg {} kind changed", arg);
    if (ka == 1) {
      std::string d = diff_tensor(fmt::format("arg {}", arg), read_tensor(a), read_tensor(b));
      if (!d.empty()) return d;
    } else if (ka == 2) {
      const int64_t la = a.next(), lb = b.next();
      if (la != lb) return fmt::format("arg {} list length {} -> {}", arg, la, lb);
      for (int64_t i = 0; i < la; ++i) {
        std::string d = diff_tensor(fmt::format("arg {}[{}]", arg, i), read_tensor(a), read_tensor(b));
        if (!d.empty()) return d;
      }
    } else if (ka == 4) {
      const int64_t va = a.next(), vb = b.next();
      if (va != vb) return fmt::format("arg {} (static) value {} -> {}", arg, bits_to_double(va), bits_to_double(vb));
    } else {
      const int64_t va = a.next(), vb = b.next();
      if (va != vb) return fmt::format("arg {} {} changed", arg, ka == 5 ? "value (hash)" : "number kind");
    }
  }
  return "";
}

}  // namespace tpu::jit::detail

namespace tpu::jit {
void set_emulate_precision_casts(bool on) { detail::emulate_default() = on; }
bool emulate_precision_casts() { return detail::emulate_default().load(); }
}  // namespace tpu::jit
