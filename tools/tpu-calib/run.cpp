#include "tools/tpu-calib/run.h"

#include <functional>
#include <stdexcept>

#include "codegen/launch.h"
#include "device/sim_driver.h"
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

namespace tpu::calib {
namespace {

const tpu::Device kDev("sim:0");
// The data's float16 has the bytes of bf16, the v4 MXU's and vector path's 16-bit type.
constexpr tpu::DType k16 = tpu::DType::bf16;

Tensor binary(const std::string& op, const Tensor& a, const Tensor& b) {
  if (op == "matmul") return tpu::matmul(a, b);
  if (op == "add") return tpu::add(a, b);
  if (op == "sub") return tpu::sub(a, b);
  if (op == "mul") return tpu::mul(a, b);
  if (op == "div") return tpu::div(a, b);
  if (op == "max" || op == "maximum") return tpu::maximum(a, b);
  if (op == "min" || op == "minimum") return tpu::minimum(a, b);
  throw std::runtime_error("unknown binary op " + op);
}

bool single_op(const std::string& op) { return op == "relu" || op == "sigmoid" || op == "tanh"; }

// JAX's activations of the data (jax.nn / the source project's definitions), one fusion each.
Tensor unary(const std::string& op, const Tensor& x) {
  if (op == "relu") return tpu::relu(x);
  if (op == "sigmoid") return tpu::sigmoid(x);
  if (op == "tanh") return tpu::tanh(x);
  // XLA's identity is a copy kernel through the vector unit; the library folds x * 1 into a DMA
  // copy, so the stand-in is a one-op vector kernel of the same traffic.
  if (op == "linear") return tpu::mul(x, 0.5);
  // where(x > 0, 1, 0) with Python ints: JAX's weak typing gives an int32 result; the stand-in
  // stores the same 4 bytes per element as f32 (the simulated chip casts to i32 on the host).
  if (op == "binary_step") return tpu::to(tpu::gt(x, 0.0), tpu::DType::f32);
  if (op == "leaky_relu") return tpu::where(tpu::gt(x, 0.0), x, tpu::mul(x, 0.01));
  if (op == "parametric_relu") return tpu::where(tpu::gt(x, 0.0), x, tpu::mul(x, 0.25));
  if (op == "elu") return tpu::where(tpu::gt(x, 0.0), x, tpu::sub(tpu::exp(x), 1.0));
  if (op == "selu")
    return tpu::mul(tpu::where(tpu::gt(x, 0.0), x, tpu::mul(tpu::sub(tpu::exp(x), 1.0), 1.6732632423543772)),
                    1.0507009873554805);
  throw std::runtime_error("unknown activation " + op);
}

// Runs `call` twice (the first builds and warms the caches), returns the second's figures.
Simulated measure(const std::function<void()>& call) {
  call();
  tpu::synchronize(kDev);
  tpu::codegen::reset_stats();
  call();
  tpu::synchronize(kDev);
  const auto s = tpu::codegen::stats();
  Simulated out;
  if (s.host_fallbacks > 0) {
    out.why = "host fallback";
    return out;
  }
  if (s.runs == 0) {
    out.why = "no kernel ran";
    return out;
  }
  out.ok = true;
  out.us = s.cycles / (tpu::device::sim_device(0).config().clock_ghz * 1e3);
  out.kernels = int(s.runs);
  out.works = s.works;
  return out;
}

// XLA's kernels of layer_norm / rms_norm over the last axis of a 16-bit [N, L, H] with float32
// gamma and beta (so the result is float32), one library call per fusion:
//   rms_norm:   sum of squares (reads x) | rsqrt of the mean ([N, L]) | x * r * gamma (reads x, writes f32)
//   layer_norm: sum (reads x) | sum of squared deviations (reads x) | the variance ([N, L]) |
//               its square root + eps ([N, L]) | (x - mean) / std * gamma + beta (reads x, writes f32)
Simulated simulate_norm(const Row& r, bool compiled) {
  if (!compiled) {  // eagerly, XLA's multi-op fusions would be several kernels each
    Simulated out;
    out.why = "compiled only (XLA's fusions are compositions of library ops)";
    return out;
  }
  const int64_t n = r.shape[0], l = r.shape[1], h = r.shape[2];
  Tensor x = tpu::empty({n, l, h}, {k16, kDev});
  Tensor g = tpu::empty({h}, {tpu::DType::f32, kDev}), b = tpu::empty({h}, {tpu::DType::f32, kDev});
  Tensor m = tpu::empty({n, l, 1}, {tpu::DType::f32, kDev});
  const double inv_h = 1.0 / double(h);
  // XLA's reduction fusions read x's bytes once and write an f32 [N, L]. The library's row sum
  // over x's bytes seen as f32 [N, L, H/2] moves the same bytes in one kernel and stores f32 (a
  // sum of bf16 into f32 is a cast and a sum in the library, two kernels); the squares or
  // deviations XLA forms on the way are vector work under that traffic.
  Tensor x_bytes = tpu::empty({n, l, h / 2}, {tpu::DType::f32, kDev});
  auto f_reduce = [&x_bytes](const Tensor&) { return tpu::sum(x_bytes, {-1}, true); };
  auto f_rms_out = tpu::compile([](const Tensor& x, const Tensor& r, const Tensor& g) { return tpu::mul(tpu::mul(x.to(tpu::DType::f32), r), g); },
                                {.name = "calib_rms_out"});
  auto f_ln_out = tpu::compile(
      [](const Tensor& x, const Tensor& m, const Tensor& s, const Tensor& g, const Tensor& b) {
        return tpu::add(tpu::mul(tpu::div(tpu::sub(x.to(tpu::DType::f32), m), s), g), b);
      },
      {.name = "calib_ln_out"});
  auto f_rsqrt = tpu::compile([inv_h](const Tensor& v) { return tpu::rsqrt(tpu::add(tpu::mul(v, inv_h), 1e-6)); }, {.name = "calib_rsqrt"});
  auto f_scale = tpu::compile([inv_h](const Tensor& v) { return tpu::mul(v, inv_h); }, {.name = "calib_scale"});
  auto f_sqrt = tpu::compile([](const Tensor& v) { return tpu::sqrt(tpu::add(v, 1e-6)); }, {.name = "calib_sqrt"});
  if (r.op == "rms_norm") return measure([&] { (void)f_rms_out(x, f_rsqrt(f_reduce(x)), g); });
  return measure([&] {
    (void)f_reduce(x);            // the mean's pass over x
    Tensor s = f_reduce(x);       // the squared deviations' pass over x
    (void)f_ln_out(x, m, f_sqrt(f_scale(s)), g, b);
  });
}

}  // namespace

std::optional<sim::XlaMatmulFeed> xla_feed(const Row& r) {
  if (r.kind != Kind::matmul || r.prefetched.empty()) return std::nullopt;
  sim::XlaMatmulFeed f;
  f.m = r.shape[0], f.n = r.shape[1], f.k = r.shape[2];
  f.a_transposed = r.a_layout == "{0,1}", f.b_transposed = r.b_layout == "{0,1}", f.out_transposed = r.out_layout == "{0,1}";
  f.prefetched = r.prefetched[0];
  return f;
}

Simulated simulate(const Row& r, bool compiled) {
  if (r.kind == Kind::norm) return simulate_norm(r, compiled);
  if (const auto feed = xla_feed(r)) {  // the library's matmul kernel, then XLA's operand feed
    Row plain = r;
    plain.prefetched.clear();
    Simulated out = simulate(plain, compiled);
    if (!out.ok) return out;
    const auto& cfg = tpu::device::sim_device(0).config();
    const double per_us = cfg.clock_ghz * 1e3;
    out.kernel_us = out.us;
    out.us = sim::xla_matmul_cycles(cfg, *feed, out.us * per_us) / per_us;
    out.feed = feed;
    return out;
  }
  Tensor a, b;
  if (r.kind == Kind::matmul) {
    a = tpu::empty({r.shape[0], r.shape[2]}, {k16, kDev});
    b = tpu::empty({r.shape[2], r.shape[1]}, {k16, kDev});
  } else {
    a = tpu::empty(r.shape, {k16, kDev});
    b = tpu::empty(r.shape, {k16, kDev});
  }
  const std::string op = r.op;
  if (r.kind == Kind::unary) {
    if (!compiled && !single_op(op)) {
      Simulated out;
      out.why = "compiled only (a composition of library ops)";
      return out;
    }
    if (compiled) {
      auto f = tpu::compile([op](const Tensor& x) { return unary(op, x); }, {.name = "calib_" + op});
      return measure([&] { (void)f(a); });
    }
    return measure([&] { (void)unary(op, a); });
  }
  if (compiled) {
    auto f = tpu::compile([op](const Tensor& x, const Tensor& y) { return binary(op, x, y); }, {.name = "calib_" + op});
    return measure([&] { (void)f(a, b); });
  }
  return measure([&] { (void)binary(op, a, b); });
}

}  // namespace tpu::calib
