// Derivative formulas of the elementwise ops: binary arithmetic, unary math, where, clamp,
// masked_fill, casts and copies. Broadcast inputs get the full-shape gradient here; the engine
// sums it down to each input's shape and casts it to the input's dtype.
#include <cmath>

#include "tpucore/autograd/formula.h"

namespace tpu::autograd::formula {
namespace {

constexpr double kPi = 3.14159265358979323846;

Scalar alpha_of(const BackwardArgs& a) { return a.attrs.has("alpha") ? a.attrs.get_scalar("alpha") : Scalar(1); }
bool is_one(Scalar s) { return s.to_double() == 1.0; }
Tensor one_minus(const Tensor& t) { return add(neg(t), 1); }

// ---- binary ----
void add_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  if (a.needs_grad(0)) g[0] = go;
  if (a.needs_grad(1)) g[1] = is_one(alpha_of(a)) ? go : mul(go, alpha_of(a));
}
void sub_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  if (a.needs_grad(0)) g[0] = go;
  if (a.needs_grad(1)) g[1] = is_one(alpha_of(a)) ? neg(go) : mul(go, -alpha_of(a).to_double());
}
// mul/div read the other operand; each input is saved only when the other needs a gradient.
void cross_saves(uint32_t needs, uint32_t& in, uint32_t& out) {
  in = ((needs & kIn1) ? kIn0 : 0u) | ((needs & kIn0) ? kIn1 : 0u);
  out = 0;
}
void mul_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  if (a.needs_grad(0)) g[0] = mul(go, a.inputs[1]);
  if (a.needs_grad(1)) g[1] = mul(go, a.inputs[0]);
}
void div_saves(uint32_t needs, uint32_t& in, uint32_t& out) {
  in = kIn1 | ((needs & kIn1) ? kIn0 : 0u);
  out = 0;
}
void div_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  const Tensor& b = a.inputs[1];
  Tensor ga = div(go, b);
  if (a.needs_grad(1)) g[1] = neg(div(mul(ga, a.inputs[0]), b));
  if (a.needs_grad(0)) g[0] = ga;
}
void pow_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  const Tensor &x = a.inputs[0], &y = a.inputs[1];
  if (a.needs_grad(0) && y.impl().wrapped_number) {
    // A number exponent (pow(x, 3)): the formula in scalars, so nothing is made on the cpu
    // for a device x.
    const Scalar e = y.item();
    const Scalar e1 = e.is_floating() ? Scalar(e.to_double() - 1) : Scalar(e.to_int() - 1);
    g[0] = e.to_double() == 0 ? zeros_like(go) : mul(go, mul(pow(x, e1), e));
  } else if (a.needs_grad(0)) {
    // d/dx x^y = y x^(y-1); 0 where y == 0 (also for x == 0).
    Tensor d = mul(y, pow(x, sub(y, 1)));
    g[0] = where(eq(y, 0), 0.0, mul(go, d));
  }
  if (a.needs_grad(1)) {
    // d/dy x^y = x^y log x; taken as 0 at x == 0 for y >= 0 (as PyTorch).
    Tensor d = mul(a.outputs[0], log(x));
    g[1] = where(logical_and(eq(x, 0), ge(y, 0)), 0.0, mul(go, d));
  }
}
void minmax_bw(const BackwardArgs& a, Grads g, bool is_max) {
  const Tensor& go = a.grad_outputs[0];
  const Tensor &x = a.inputs[0], &y = a.inputs[1];
  // The larger (smaller) side gets the gradient; ties split it evenly.
  Tensor half = mul(go, 0.5);
  Tensor x_wins = is_max ? gt(x, y) : lt(x, y);
  Tensor tie = eq(x, y);
  if (a.needs_grad(0)) g[0] = where(tie, half, where(x_wins, go, 0.0));
  if (a.needs_grad(1)) g[1] = where(tie, half, where(x_wins, 0.0, go));
}
void maximum_bw(const BackwardArgs& a, Grads g) { minmax_bw(a, g, true); }
void minimum_bw(const BackwardArgs& a, Grads g) { minmax_bw(a, g, false); }
void fmod_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  if (a.needs_grad(0)) g[0] = go;
  if (a.needs_grad(1)) {
    // fmod(x, y) = x - trunc(x / y) y
    Tensor q = div(a.inputs[0], a.inputs[1]);
    Tensor trunc = mul(sign(q), floor(abs(q)));
    g[1] = neg(mul(go, trunc));
  }
}

// ---- where / clamp / masked_fill ----
void where_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  const Tensor& c = a.inputs[0];
  if (a.needs_grad(1)) g[1] = where(c, go, 0.0);
  if (a.needs_grad(2)) g[2] = where(c, 0.0, go);
}
void clamp_bw(const BackwardArgs& a, Grads g) {
  const Tensor& x = a.inputs[0];
  Tensor keep;
  if (a.attrs.has("min")) keep = ge(x, a.attrs.get_scalar("min"));
  if (a.attrs.has("max")) {
    Tensor k2 = le(x, a.attrs.get_scalar("max"));
    keep = keep.defined() ? logical_and(keep, k2) : k2;
  }
  g[0] = keep.defined() ? where(keep, a.grad_outputs[0], 0.0) : a.grad_outputs[0];
}
void masked_fill_bw(const BackwardArgs& a, Grads g) {
  if (a.needs_grad(0)) g[0] = masked_fill(a.grad_outputs[0], a.inputs[1], 0);
}

// ---- casts and copies: the engine casts the gradient back to the input dtype ----
void identity_bw(const BackwardArgs& a, Grads g) { g[0] = a.grad_outputs[0]; }

// ---- unary ----
const Tensor& G(const BackwardArgs& a) { return a.grad_outputs[0]; }
const Tensor& X(const BackwardArgs& a) { return a.inputs[0]; }
const Tensor& Y(const BackwardArgs& a) { return a.outputs[0]; }

void neg_bw(const BackwardArgs& a, Grads g) { g[0] = neg(G(a)); }
void abs_bw(const BackwardArgs& a, Grads g) { g[0] = mul(G(a), sign(X(a))); }
// sign, floor, ceil, round: piecewise constant, zero gradient (as PyTorch).
void zero_bw(const BackwardArgs& a, Grads g) { g[0] = zeros_like(G(a)); }
void relu_bw(const BackwardArgs& a, Grads g) { g[0] = where(gt(Y(a), 0), G(a), 0.0); }
void exp_bw(const BackwardArgs& a, Grads g) { g[0] = mul(G(a), Y(a)); }
void log_bw(const BackwardArgs& a, Grads g) { g[0] = div(G(a), X(a)); }
void log1p_bw(const BackwardArgs& a, Grads g) { g[0] = div(G(a), add(X(a), 1)); }
void expm1_bw(const BackwardArgs& a, Grads g) { g[0] = mul(G(a), add(Y(a), 1)); }
void sqrt_bw(const BackwardArgs& a, Grads g) { g[0] = div(mul(G(a), 0.5), Y(a)); }
void rsqrt_bw(const BackwardArgs& a, Grads g) {
  const Tensor& y = Y(a);
  g[0] = mul(G(a), mul(mul(y, mul(y, y)), -0.5));
}
void reciprocal_bw(const BackwardArgs& a, Grads g) { g[0] = neg(mul(G(a), mul(Y(a), Y(a)))); }
void sin_bw(const BackwardArgs& a, Grads g) { g[0] = mul(G(a), cos(X(a))); }
void cos_bw(const BackwardArgs& a, Grads g) { g[0] = neg(mul(G(a), sin(X(a)))); }
void tanh_bw(const BackwardArgs& a, Grads g) { g[0] = mul(G(a), one_minus(mul(Y(a), Y(a)))); }
void sigmoid_bw(const BackwardArgs& a, Grads g) { g[0] = mul(G(a), mul(Y(a), one_minus(Y(a)))); }
void silu_bw(const BackwardArgs& a, Grads g) {
  const Tensor& x = X(a);
  Tensor s = sigmoid(x);
  g[0] = mul(G(a), mul(s, add(mul(x, one_minus(s)), 1)));
}
void erf_bw(const BackwardArgs& a, Grads g) {
  const Tensor& x = X(a);
  g[0] = mul(G(a), mul(exp(neg(mul(x, x))), 2.0 / std::sqrt(kPi)));
}
void gelu_bw(const BackwardArgs& a, Grads g) {
  const Tensor& x = X(a);
  Tensor d;
  if (a.attrs.get_bool("tanh_approx", false)) {
    const double k = std::sqrt(2.0 / kPi), c = 0.044715;
    Tensor x2 = mul(x, x);
    Tensor t = tanh(mul(mul(x, add(mul(x2, c), 1)), k));
    // 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2)
    Tensor left = mul(add(t, 1), 0.5);
    Tensor right = mul(mul(mul(x, one_minus(mul(t, t))), add(mul(x2, 3 * c), 1)), 0.5 * k);
    d = add(left, right);
  } else {
    // Phi(x) + x phi(x)
    Tensor cdf = mul(add(erf(mul(x, 1.0 / std::sqrt(2.0))), 1), 0.5);
    Tensor pdf = mul(exp(mul(mul(x, x), -0.5)), 1.0 / std::sqrt(2.0 * kPi));
    d = add(cdf, mul(x, pdf));
  }
  g[0] = mul(G(a), d);
}

[[maybe_unused]] const bool elementwise_registered = [] {
  define("add", &add_bw);
  define("sub", &sub_bw);
  define("mul", &mul_bw, 0, 0, &cross_saves);
  define("div", &div_bw, 0, 0, &div_saves);
  define("pow", &pow_bw, kIn0 | kIn1, kOut0);
  define("maximum", &maximum_bw, kIn0 | kIn1);
  define("minimum", &minimum_bw, kIn0 | kIn1);
  define("fmod", &fmod_bw, kIn0 | kIn1);
  define("where", &where_bw, kIn0);
  define("clamp", &clamp_bw, kIn0);
  define("masked_fill", &masked_fill_bw, kIn1);
  define("to_dtype", &identity_bw);
  define("contiguous", &identity_bw);
  define("neg", &neg_bw);
  define("abs", &abs_bw, kIn0);
  for (const char* op : {"sign", "floor", "ceil", "round"}) define(op, &zero_bw);
  define("relu", &relu_bw, 0, kOut0);
  define("exp", &exp_bw, 0, kOut0);
  define("log", &log_bw, kIn0);
  define("log1p", &log1p_bw, kIn0);
  define("expm1", &expm1_bw, 0, kOut0);
  define("sqrt", &sqrt_bw, 0, kOut0);
  define("rsqrt", &rsqrt_bw, 0, kOut0);
  define("reciprocal", &reciprocal_bw, 0, kOut0);
  define("sin", &sin_bw, kIn0);
  define("cos", &cos_bw, kIn0);
  define("tanh", &tanh_bw, 0, kOut0);
  define("sigmoid", &sigmoid_bw, 0, kOut0);
  define("silu", &silu_bw, kIn0);
  define("erf", &erf_bw, kIn0);
  define("gelu", &gelu_bw, kIn0);
  return true;
}();

}  // namespace
}  // namespace tpu::autograd::formula
