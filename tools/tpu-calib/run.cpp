#include "tools/tpu-calib/run.h"

#include <functional>
#include <stdexcept>

#include "codegen/launch.h"
#include "device/sim_driver.h"
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"

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
  if (op == "linear") return tpu::mul(x, 1.0);  // a copy kernel (jit of the identity still writes the output)
  if (op == "binary_step") return tpu::where(tpu::gt(x, 0.0), tpu::ones_like(x), tpu::zeros_like(x));
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
  const int64_t n = r.shape[0], l = r.shape[1], h = r.shape[2];
  Tensor x = tpu::empty({n, l, h}, {k16, kDev});
  Tensor g = tpu::empty({h}, {tpu::DType::f32, kDev}), b = tpu::empty({h}, {tpu::DType::f32, kDev});
  Tensor m = tpu::empty({n, l, 1}, {tpu::DType::f32, kDev});
  const double inv_h = 1.0 / double(h);
  auto sumsq = [](const Tensor& x) {
    Tensor f = x.to(tpu::DType::f32);
    return tpu::sum(tpu::mul(f, f), {-1}, true);
  };
  auto sumdev = [](const Tensor& x, const Tensor& m) {
    Tensor d = tpu::sub(x.to(tpu::DType::f32), m);
    return tpu::sum(tpu::mul(d, d), {-1}, true);
  };
  auto rms_out = [](const Tensor& x, const Tensor& r, const Tensor& g) { return tpu::mul(tpu::mul(x.to(tpu::DType::f32), r), g); };
  auto ln_out = [](const Tensor& x, const Tensor& m, const Tensor& s, const Tensor& g, const Tensor& b) {
    return tpu::add(tpu::mul(tpu::div(tpu::sub(x.to(tpu::DType::f32), m), s), g), b);
  };
  auto small = [inv_h](const Tensor& v) { return tpu::rsqrt(tpu::add(tpu::mul(v, inv_h), 1e-6)); };
  auto scale = [inv_h](const Tensor& v) { return tpu::mul(v, inv_h); };
  auto sqrt_eps = [](const Tensor& v) { return tpu::sqrt(tpu::add(v, 1e-6)); };
  if (compiled) {
    auto f_sumsq = tpu::compile(sumsq, {.name = "calib_sumsq"});
    auto f_sumdev = tpu::compile(sumdev, {.name = "calib_sumdev"});
    auto f_rms_out = tpu::compile(rms_out, {.name = "calib_rms_out"});
    auto f_ln_out = tpu::compile(ln_out, {.name = "calib_ln_out"});
    auto f_small = tpu::compile(small, {.name = "calib_rsqrt"});
    auto f_scale = tpu::compile(scale, {.name = "calib_scale"});
    auto f_sqrt = tpu::compile(sqrt_eps, {.name = "calib_sqrt"});
    if (r.op == "rms_norm")
      return measure([&] { (void)f_rms_out(x, f_small(f_sumsq(x)), g); });
    return measure([&] {
      Tensor s = f_sumdev(x, m);
      (void)f_sumsq(x);  // the first pass (XLA: convert_reduce_fusion; reads x like the sum)
      (void)f_ln_out(x, m, f_sqrt(f_scale(s)), g, b);
    });
  }
  if (r.op == "rms_norm") return measure([&] { (void)rms_out(x, small(sumsq(x)), g); });
  return measure([&] {
    Tensor s = sumdev(x, m);
    (void)sumsq(x);
    (void)ln_out(x, m, sqrt_eps(scale(s)), g, b);
  });
}

}  // namespace

Simulated simulate(const Row& r, bool compiled) {
  if (r.kind == Kind::norm) return simulate_norm(r, compiled);
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
    if (!compiled && !single_op(op)) return {.ok = false, .why = "compiled only (a composition of library ops)"};
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
