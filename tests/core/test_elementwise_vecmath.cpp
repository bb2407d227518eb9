// Accuracy of every vec_math implementation (the portable one and each Highway target this CPU
// runs: AVX-512, AVX2, SSE4 and the baseline, each called explicitly; AVX2 or AVX-512 missing is
// reported as skipped) against double-precision references, measured in f32 ulps over dense grids,
// plus special values, tails of every length, in-place use and the binary kernels.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ops/cpu/vec_math.h"

using tpu::ops::cpu::VecBinary;
using tpu::ops::cpu::VecMathTable;
using tpu::ops::cpu::VecUnary;

namespace {

// The implementations this CPU can run; each missing one is reported as skipped.
std::vector<const VecMathTable*> tables() {
  std::vector<const VecMathTable*> t = {&tpu::ops::cpu::vec_math_scalar()};
  for (const VecMathTable* a : tpu::ops::cpu::vec_math_targets()) t.push_back(a);
  if (!tpu::ops::cpu::vec_math_avx2()) WARN("vec_math avx2 skipped: this CPU lacks AVX2+FMA (or TPU_CPU_FEATURES=generic)");
  if (!tpu::ops::cpu::vec_math_avx512()) WARN("vec_math avx512 skipped: this CPU lacks AVX-512 (or TPU_CPU_FEATURES=generic)");
  return t;
}

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct VecMathCase {
  VecUnary op;
  const char* name;
  double (*ref)(double);
  double lo, hi;
  double max_ulp;  // allowed error, ulps of the f32 result
  // Condition number |x f'(x) / f(x)| where it is large: rounding the argument to f32 alone
  // costs that many ulps (gelu's negative tail), so it is added to the bound.
  double (*cond)(double) = nullptr;
};

double gelu_cond(double x) { return x < 0 ? 1.5 * x * x : 0.0; }  // x^2 plus the rounded 1/sqrt 2
double gelu_tanh_cond(double x) {
  return x < 0 ? 1.6 * std::fabs(x + 3 * 0.044715 * x * x * x) : 0.0;
}

const VecMathCase kCases[] = {
    {VecUnary::exp, "exp", [](double x) { return std::exp(x); }, -103.0, 88.7, 2.0},
    {VecUnary::log, "log", [](double x) { return std::log(x); }, 1e-3, 1e3, 2.0},
    {VecUnary::tanh, "tanh", [](double x) { return std::tanh(x); }, -10.0, 10.0, 3.0},
    {VecUnary::sigmoid, "sigmoid", sigmoid_ref, -100.0, 100.0, 3.0},
    {VecUnary::silu, "silu", [](double x) { return x * sigmoid_ref(x); }, -80.0, 80.0, 4.0},
    {VecUnary::erf, "erf", [](double x) { return std::erf(x); }, -5.0, 5.0, 3.0},
    {VecUnary::gelu_erf, "gelu", [](double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }, -12.0, 12.0, 8.0, gelu_cond},
    {VecUnary::gelu_tanh, "gelu_tanh",
     [](double x) { return x * sigmoid_ref(2.0 * std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)); }, -12.0, 12.0, 4.0, gelu_tanh_cond},
    {VecUnary::relu, "relu", [](double x) { return x < 0 ? 0.0 : x; }, -5.0, 5.0, 0.0},
};

// Distance in f32 ulps of `got` from the exact value `ref` (ulp taken at the result's magnitude;
// results below the smallest normal are measured in units of the smallest denormal step... of
// normals, so denormal outputs do not inflate the figure).
double ulp_error(float got, double ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0 : 1e9;
  if (std::isinf(ref) || std::fabs(ref) > 3.4028234663852886e38) {
    return (std::isinf(got) && (got > 0) == (ref > 0)) ? 0 : 1e9;
  }
  if (std::isnan(got) || std::isinf(got)) return 1e9;
  const float rf = static_cast<float>(std::fabs(ref));
  float ulp = std::nextafter(rf, INFINITY) - rf;
  if (ulp < 1.1754943508222875e-38f * 1.1920929e-07f) ulp = 1.1754943508222875e-38f * 1.1920929e-07f;
  return std::fabs(static_cast<double>(got) - ref) / ulp;
}

std::vector<float> grid(double lo, double hi, int n) {
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<float>(lo + (hi - lo) * i / (n - 1)));
  return v;
}

}  // namespace

TEST_CASE("vec_math: unary functions within their ulp bounds on every implementation", "[elementwise][vecmath]") {
  for (const VecMathTable* t : tables()) {
    for (const VecMathCase& c : kCases) {
      std::vector<float> x = grid(c.lo, c.hi, 20011);
      // Extra points near 0 and in the log-spaced middle of the range.
      for (double e = -30; e <= 1; e += 0.25) {
        const float v = static_cast<float>(std::pow(10.0, e));
        if (v >= c.lo && v <= c.hi) x.push_back(v);
        if (-v >= c.lo && -v <= c.hi) x.push_back(-v);
      }
      std::vector<float> y(x.size());
      t->get(c.op)(y.data(), x.data(), static_cast<int64_t>(x.size()));
      double worst = 0, worst_excess = -1e9, worst_beyond = 0;
      float worst_x = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double e = ulp_error(y[i], c.ref(x[i]));
        const double excess = e - c.max_ulp - (c.cond ? c.cond(x[i]) : 0.0);
        worst = std::max(worst, e);
        worst_beyond = std::max(worst_beyond, excess + c.max_ulp);
        if (excess > worst_excess) {
          worst_excess = excess;
          worst_x = x[i];
        }
      }
      INFO(t->name << " " << c.name << ": max error " << worst << " ulp, " << worst_beyond
                   << " beyond the condition number; closest to the bound at x = " << worst_x);
      CHECK(worst_excess <= 0);
    }
  }
}

TEST_CASE("vec_math: log over the whole positive range including denormals", "[elementwise][vecmath]") {
  for (const VecMathTable* t : tables()) {
    std::vector<float> x;
    for (uint32_t bits = 1; bits < 0x7f800000u; bits += 0x1235u) {
      float f;
      std::memcpy(&f, &bits, 4);
      x.push_back(f);
    }
    std::vector<float> y(x.size());
    t->get(VecUnary::log)(y.data(), x.data(), static_cast<int64_t>(x.size()));
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, ulp_error(y[i], std::log(static_cast<double>(x[i]))));
    INFO(t->name << ": max log error " << worst << " ulp");
    CHECK(worst <= 2.0);
  }
}

TEST_CASE("vec_math: gelu over every 4099th float of [-16, 16] within its bound", "[elementwise][vecmath]") {
  // Both signs of every 4099th bit pattern up to 16 (denormals, the cancellation near 0, the
  // denormal tail below -13.2 and the flat x > 5.5 side included), against erfc in double.
  std::vector<float> x;
  for (uint32_t bits = 0; bits <= 0x41800000u; bits += 4099u) {
    float f;
    std::memcpy(&f, &bits, 4);
    x.push_back(f);
    x.push_back(-f);
  }
  for (const VecMathTable* t : tables()) {
    std::vector<float> y(x.size());
    t->get(VecUnary::gelu_erf)(y.data(), x.data(), static_cast<int64_t>(x.size()));
    double worst_beyond = 0;
    float worst_x = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double ref = 0.5 * x[i] * std::erfc(-x[i] / std::sqrt(2.0));
      const double beyond = ulp_error(y[i], ref) - gelu_cond(x[i]);
      if (beyond > worst_beyond) worst_beyond = beyond, worst_x = x[i];
    }
    INFO(t->name << ": gelu error up to " << worst_beyond << " ulp beyond the condition number, at x = " << worst_x);
    CHECK(worst_beyond <= 8.0);
  }
}

TEST_CASE("vec_math: denormal, huge and extreme inputs within the ulp bounds", "[elementwise][vecmath]") {
  const float kMax = 3.40282347e38f;
  const float mags[] = {1.4e-45f, 1e-42f, 1e-40f, 1.1754942e-38f, 1.1754944e-38f, 1e-20f,
                        30.0f,    87.0f,  89.0f,  1e4f,           1e30f,          kMax};
  for (const VecMathTable* t : tables()) {
    for (const VecMathCase& c : kCases) {
      std::vector<float> x;
      for (float m : mags) {
        x.push_back(m);
        if (c.op != VecUnary::log) x.push_back(-m);
      }
      std::vector<float> y(x.size());
      t->get(c.op)(y.data(), x.data(), static_cast<int64_t>(x.size()));
      for (size_t i = 0; i < x.size(); ++i) {
        const double bound = c.max_ulp + (c.cond ? c.cond(x[i]) : 0.0);
        INFO(t->name << " " << c.name << "(" << x[i] << ") = " << y[i] << ", want " << c.ref(x[i]));
        CHECK(ulp_error(y[i], c.ref(x[i])) <= bound);
      }
    }
  }
}

TEST_CASE("vec_math: special values", "[elementwise][vecmath]") {
  const float inf = INFINITY, nan = NAN;
  for (const VecMathTable* t : tables()) {
    INFO(t->name);
    auto run = [&](VecUnary op, float v) {
      float o;
      t->get(op)(&o, &v, 1);
      return o;
    };
    CHECK(run(VecUnary::exp, -inf) == 0.0f);
    CHECK(run(VecUnary::exp, inf) == inf);
    CHECK(run(VecUnary::exp, 89.0f) == inf);
    CHECK(run(VecUnary::exp, 0.0f) == 1.0f);
    CHECK(std::isnan(run(VecUnary::exp, nan)));
    CHECK(run(VecUnary::log, 0.0f) == -inf);
    CHECK(run(VecUnary::log, -0.0f) == -inf);
    CHECK(run(VecUnary::log, inf) == inf);
    CHECK(run(VecUnary::log, 1.0f) == 0.0f);
    CHECK(std::isnan(run(VecUnary::log, -1.0f)));
    CHECK(std::isnan(run(VecUnary::log, nan)));
    CHECK(run(VecUnary::tanh, inf) == 1.0f);
    CHECK(run(VecUnary::tanh, -inf) == -1.0f);
    CHECK(std::signbit(run(VecUnary::tanh, -0.0f)));
    CHECK(std::isnan(run(VecUnary::tanh, nan)));
    CHECK(run(VecUnary::sigmoid, -inf) == 0.0f);
    CHECK(run(VecUnary::sigmoid, inf) == 1.0f);
    CHECK(run(VecUnary::sigmoid, 0.0f) == 0.5f);
    CHECK(std::isnan(run(VecUnary::sigmoid, nan)));
    CHECK(run(VecUnary::erf, inf) == 1.0f);
    CHECK(run(VecUnary::erf, -inf) == -1.0f);
    CHECK(std::isnan(run(VecUnary::erf, nan)));
    CHECK(run(VecUnary::gelu_erf, inf) == inf);
    CHECK(std::isnan(run(VecUnary::gelu_erf, -inf)));  // -inf * 0, as in PyTorch
    CHECK(run(VecUnary::gelu_erf, 0.0f) == 0.0f);
    CHECK(std::isnan(run(VecUnary::gelu_erf, nan)));
    CHECK(run(VecUnary::gelu_tanh, inf) == inf);
    CHECK(std::isnan(run(VecUnary::relu, nan)));
    CHECK(run(VecUnary::relu, -inf) == 0.0f);
    CHECK(std::isnan(run(VecUnary::silu, nan)));
  }
}

TEST_CASE("vec_math: every tail length and in-place use agree with the element-by-element result",
          "[elementwise][vecmath]") {
  for (const VecMathTable* t : tables()) {
    for (const VecMathCase& c : kCases) {
      for (int n = 0; n <= 70; ++n) {
        std::vector<float> x = grid(-3.0, 3.0, n < 2 ? 2 : n);
        x.resize(static_cast<size_t>(n));
        if (c.op == VecUnary::log)
          for (float& v : x) v = std::fabs(v) + 0.1f;
        // Guard cells catch writes past the end.
        std::vector<float> y(static_cast<size_t>(n) + 4, 12345.0f);
        t->get(c.op)(y.data(), x.data(), n);
        std::vector<float> z = x;
        t->get(c.op)(z.data(), z.data(), n);
        for (int i = 0; i < n; ++i) {
          float one;
          t->get(c.op)(&one, &x[static_cast<size_t>(i)], 1);
          REQUIRE(y[static_cast<size_t>(i)] == one);
          REQUIRE(z[static_cast<size_t>(i)] == one);
        }
        for (int g = 0; g < 4; ++g) REQUIRE(y[static_cast<size_t>(n + g)] == 12345.0f);
      }
    }
  }
}

TEST_CASE("vec_math: unary streaming path (large arrays): misaligned head, tail, in place, no write past the end",
          "[elementwise][vecmath]") {
  // 1<<20 + 45 elements at offsets 0 and 3 (floats): the non-temporal store body with and
  // without a head to a vector-aligned output, and a tail that is not a whole vector. Each
  // element must equal the one-element result (no dependence on the path taken) and stay
  // within the function's bound of the double reference; in place (out == in) gives the same.
  const int64_t n = (int64_t{1} << 20) + 45;
  const VecMathCase* gelu = nullptr;
  for (const VecMathCase& c : kCases)
    if (c.op == VecUnary::gelu_erf) gelu = &c;
  REQUIRE(gelu);
  for (const VecMathTable* t : tables()) {
    for (VecUnary op : {VecUnary::gelu_erf, VecUnary::exp, VecUnary::relu}) {
      for (size_t off : {size_t{0}, size_t{3}}) {
        INFO(t->name << " op " << static_cast<int>(op) << " offset " << off);
        std::vector<float> xb(static_cast<size_t>(n) + 8), ob(static_cast<size_t>(n) + 8, 4321.0f);
        for (size_t i = 0; i < xb.size(); ++i) xb[i] = static_cast<float>(static_cast<int64_t>(i % 1999) - 999) * 0.011f;
        const float* x = xb.data() + off;
        float* o = ob.data() + off;
        t->get(op)(o, x, n);
        std::vector<float> z(x, x + n);
        t->get(op)(z.data(), z.data(), n);
        int64_t differ = 0, off_bound = 0;
        // Every 7th element, the first and last few (head and tail) in full.
        for (int64_t i = 0; i < n; i += (i < 64 || i > n - 64) ? 1 : 7) {
          float one;
          t->get(op)(&one, &x[i], 1);
          if (!(o[i] == one && z[static_cast<size_t>(i)] == one)) ++differ;
          if (op == VecUnary::gelu_erf &&
              ulp_error(o[i], gelu->ref(x[i])) > gelu->max_ulp + gelu->cond(x[i]))
            ++off_bound;
        }
        CHECK(differ == 0);
        CHECK(off_bound == 0);
        CHECK(ob[off + static_cast<size_t>(n)] == 4321.0f);
        if (off) CHECK(ob[off - 1] == 4321.0f);
      }
    }
  }
}

TEST_CASE("vec_math: binary kernels, broadcast right operand, alpha and the streaming path", "[elementwise][vecmath]") {
  for (const VecMathTable* t : tables()) {
    INFO(t->name);
    // 1<<20 + 37 elements at an odd offset reach the non-temporal store path with a head and tail.
    const int64_t n = (int64_t{1} << 20) + 37;
    std::vector<float> xb(static_cast<size_t>(n) + 8), yb(static_cast<size_t>(n) + 8), ob(static_cast<size_t>(n) + 8);
    for (int64_t i = 0; i < n + 8; ++i) {
      xb[static_cast<size_t>(i)] = static_cast<float>((i % 97) - 48) * 0.25f;
      yb[static_cast<size_t>(i)] = static_cast<float>((i % 13) + 1) * 0.5f;
    }
    const float* x = xb.data() + 3;
    const float* y = yb.data() + 3;
    float* o = ob.data() + 3;
    struct B {
      VecBinary op;
      double (*f)(double, double, double);
    };
    const B ops[] = {
        {VecBinary::add, [](double a, double b, double al) { return a + al * b; }},
        {VecBinary::sub, [](double a, double b, double al) { return a - al * b; }},
        {VecBinary::mul, [](double a, double b, double) { return a * b; }},
        {VecBinary::div, [](double a, double b, double) { return a / b; }},
        {VecBinary::maximum, [](double a, double b, double) { return std::max(a, b); }},
        {VecBinary::minimum, [](double a, double b, double) { return std::min(a, b); }},
    };
    for (const B& b : ops) {
      for (float alpha : {1.0f, -2.5f}) {
        for (int64_t len : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{33}, n}) {
          for (bool ys : {false, true}) {
            ob[static_cast<size_t>(len) + 3] = 777.0f;
            t->get(b.op)(o, x, y, ys, alpha, len);
            int64_t bad = 0;
            for (int64_t i = 0; i < len; ++i) {
              const double want = static_cast<float>(b.f(x[i], ys ? y[0] : y[i], alpha));
              if (std::fabs(o[i] - want) > 1e-6 * std::fabs(want)) ++bad;
            }
            INFO("op " << static_cast<int>(b.op) << " len " << len << " scalar rhs " << ys);
            CHECK(bad == 0);
            CHECK(ob[static_cast<size_t>(len) + 3] == 777.0f);
          }
        }
      }
    }
    // NaN on either side of maximum/minimum propagates.
    const float nan = NAN;
    float one = 1.0f, r;
    t->get(VecBinary::maximum)(&r, &nan, &one, false, 1.0f, 1);
    CHECK(std::isnan(r));
    t->get(VecBinary::minimum)(&r, &one, &nan, false, 1.0f, 1);
    CHECK(std::isnan(r));
  }
}

namespace {

using tpu::ops::cpu::VecOperand;
using tpu::ops::cpu::VecStep;
using tpu::ops::cpu::VecStepKind;

// Step s over whole arrays with the table's one-op kernels and std:: functions (the
// reference for a fused program): vals[k] holds operand k's n values (a scalar repeated).
void reference_step(const VecMathTable& t, const VecStep& s, std::vector<std::vector<float>>& vals, int64_t n) {
  const std::vector<float>& x = vals[static_cast<size_t>(s.in0)];
  std::vector<float>& o = vals[static_cast<size_t>(s.out)];
  o.assign(static_cast<size_t>(n), 0.0f);
  switch (s.kind) {
    case VecStepKind::binary: t.get(s.bin)(o.data(), x.data(), vals[static_cast<size_t>(s.in1)].data(), false, s.alpha, n); break;
    case VecStepKind::unary: t.get(s.un)(o.data(), x.data(), n); break;
    case VecStepKind::neg: for (int64_t i = 0; i < n; ++i) o[i] = -x[i]; break;
    case VecStepKind::abs: for (int64_t i = 0; i < n; ++i) o[i] = std::fabs(x[i]); break;
    case VecStepKind::sqrt: for (int64_t i = 0; i < n; ++i) o[i] = std::sqrt(x[i]); break;
    case VecStepKind::rsqrt: for (int64_t i = 0; i < n; ++i) o[i] = 1.0f / std::sqrt(x[i]); break;
    case VecStepKind::recip: for (int64_t i = 0; i < n; ++i) o[i] = 1.0f / x[i]; break;
    case VecStepKind::copy: o = x; break;
  }
}

bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0; }

// Runs `steps` (operands 0, 1: memory inputs; 2: the scalar 1.75; then one per step) on every
// length that exercises blocks, sub-blocks and tails, with unaligned and streamed outputs, and
// checks the operands `outs` bit for bit against the steps run one by one.
void check_program(const VecMathTable* t, bool own, const std::vector<VecStep>& steps, const std::vector<int>& outs) {
  const int nops = 3 + static_cast<int>(steps.size());
  for (int64_t n : {1, 7, 8, 31, 32, 33, 255, 256, 257, 600, 1000, 2048, 2049}) {
    for (bool stream : {false, true}) {
      INFO("n " << n << " stream " << stream);
      std::vector<std::vector<float>> ref(static_cast<size_t>(nops));
      ref[0].resize(static_cast<size_t>(n));
      ref[1].resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        ref[0][static_cast<size_t>(i)] = static_cast<float>((i * 37) % 101 - 50) * 0.07f;
        ref[1][static_cast<size_t>(i)] = static_cast<float>((i * 11) % 23 + 1) * 0.3f;
      }
      ref[0][0] = NAN;
      if (n > 5) ref[0][5] = INFINITY;
      if (n > 6) ref[1][6] = -INFINITY;
      ref[2].assign(static_cast<size_t>(n), 1.75f);
      for (const VecStep& s : steps) reference_step(*t, s, ref, n);

      // Memory operands at an offset of 3 floats (unaligned) or 0, with guard cells after.
      const size_t off = stream ? 0 : 3;
      std::vector<std::vector<float>> mem(outs.size(), std::vector<float>(static_cast<size_t>(n) + 16 + off, 999.0f));
      std::vector<float> in0(off), in1(off);
      in0.insert(in0.end(), ref[0].begin(), ref[0].end());
      in1.insert(in1.end(), ref[1].begin(), ref[1].end());
      const float scalar = 1.75f;
      std::vector<VecOperand> ops(static_cast<size_t>(nops));
      ops[0].in = in0.data() + off;
      ops[1].in = in1.data() + off;
      ops[2].in = &scalar;
      ops[2].scalar = true;
      // Streamed outputs must be 32-byte aligned to stream; vectors give 16, so align by hand.
      std::vector<float*> dst;
      for (size_t j = 0; j < outs.size(); ++j) {
        float* base = mem[j].data() + off;
        if (stream) base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(mem[j].data()) + 31) & ~uintptr_t{31});
        dst.push_back(base);
        ops[static_cast<size_t>(outs[j])].out = base;
        ops[static_cast<size_t>(outs[j])].stream = stream;
      }
      if (own) t->program(steps.data(), static_cast<int>(steps.size()), ops.data(), nops, n);
      else tpu::ops::cpu::run_vec_program_blocks(*t, steps.data(), static_cast<int>(steps.size()), ops.data(), nops, n);
      for (size_t j = 0; j < outs.size(); ++j) {
        const std::vector<float>& want = ref[static_cast<size_t>(outs[j])];
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < n; ++i)
          if (!same_float(dst[j][i], want[static_cast<size_t>(i)])) {
            ++bad;
            if (first < 0) first = i;
          }
        INFO("output operand " << outs[j] << ": first mismatch at " << first << (first >= 0 ? " got " + std::to_string(dst[j][first]) + " want " + std::to_string(want[static_cast<size_t>(first)]) : std::string()));
        CHECK(bad == 0);
        for (int g = 0; g < 8; ++g) CHECK(dst[j][n + g] == 999.0f);  // nothing written past n
      }
    }
  }
}

// Every table through the portable block executor, and the tables that have their own
// executor (the Highway ones) through it too.
struct Executor {
  const VecMathTable* t;
  bool own;
};
std::vector<Executor> executors() {
  std::vector<Executor> e;
  for (const VecMathTable* t : tables()) {
    e.push_back({t, false});
    if (t->program) e.push_back({t, true});
  }
  return e;
}

}  // namespace

TEST_CASE("vec_math: fused programs give the results of their steps run one by one", "[elementwise][vecmath]") {
  for (const auto [t, own] : executors()) {
    INFO(t->name << (own ? " (its own executor)" : " (block executor)"));
    // Operands 0, 1: memory inputs; 2: a scalar; then one per step. Every unary and binary op,
    // the scalar as left and right operand, alpha != 1, a value read again much later, and
    // outputs in the middle (read by later steps) and at the end.
    std::vector<VecStep> steps;
    auto add = [&](VecStepKind k, int in0, int in1 = -1) -> VecStep& {
      VecStep s;
      s.kind = k;
      s.in0 = static_cast<int16_t>(in0);
      s.in1 = static_cast<int16_t>(in1);
      s.out = static_cast<int16_t>(3 + steps.size());
      steps.push_back(s);
      return steps.back();
    };
    auto last = [&] { return 2 + static_cast<int>(steps.size()); };
    std::vector<int> shared_mul;
    add(VecStepKind::binary, 0, 2).bin = VecBinary::mul;  // x * s
    add(VecStepKind::binary, last(), 1).bin = VecBinary::add;
    for (int u = 0; u < static_cast<int>(VecUnary::count); ++u) {
      add(VecStepKind::unary, u % 2 ? last() : 3).un = static_cast<VecUnary>(u);
      VecStep& b = add(VecStepKind::binary, last(), u % 3 == 0 ? 2 : 0);
      b.bin = static_cast<VecBinary>(u % static_cast<int>(VecBinary::count));
      b.alpha = u % 2 ? -0.75f : 1.0f;
    }
    add(VecStepKind::binary, 2, last()).bin = VecBinary::sub;  // scalar on the left
    for (VecStepKind k : {VecStepKind::neg, VecStepKind::abs, VecStepKind::sqrt, VecStepKind::rsqrt, VecStepKind::recip,
                          VecStepKind::copy})
      add(k, last());
    add(VecStepKind::binary, last(), 4).bin = VecBinary::maximum;
    // Bias and activation shapes an executor may fold into one pass: gelu(x * a + b),
    // tanh(b + a * x), exp(x + b), sigmoid(x * a); and a multiply with a second reader.
    const int base = last();
    add(VecStepKind::binary, base, 0).bin = VecBinary::mul;
    add(VecStepKind::binary, last(), 1).bin = VecBinary::add;
    add(VecStepKind::unary, last()).un = VecUnary::gelu_erf;
    add(VecStepKind::binary, 1, base).bin = VecBinary::mul;
    add(VecStepKind::binary, 2, last()).bin = VecBinary::add;
    add(VecStepKind::unary, last()).un = VecUnary::tanh;
    add(VecStepKind::binary, last(), 2).bin = VecBinary::add;
    add(VecStepKind::unary, last()).un = VecUnary::exp;
    add(VecStepKind::binary, last(), 1).bin = VecBinary::mul;
    add(VecStepKind::unary, last()).un = VecUnary::sigmoid;
    const int shared = add(VecStepKind::binary, last(), 0).out;  // read twice: stays a step
    shared_mul.push_back(shared);
    add(VecStepKind::unary, shared).un = VecUnary::silu;
    add(VecStepKind::binary, last(), shared).bin = VecBinary::add;
    const int nops = 3 + static_cast<int>(steps.size());
    REQUIRE(nops <= tpu::ops::cpu::kVecProgramMaxOperands);
    const std::vector<int> outs = {4, 9, nops - 1};

    check_program(t, own, steps, outs);
  }
}

TEST_CASE("vec_math: programs that fold into one pass over memory", "[elementwise][vecmath]") {
  // A program left with one step after folding, reading memory only, runs without block slots
  // on the Highway executor; with a scalar operand, or a second step, it takes the block loop.
  auto step = [](VecStepKind k, int in0, int in1, int out) {
    VecStep s;
    s.kind = k;
    s.in0 = static_cast<int16_t>(in0);
    s.in1 = static_cast<int16_t>(in1);
    s.out = static_cast<int16_t>(out);
    return s;
  };
  auto bin = [&](VecBinary b, int in0, int in1, int out) {
    VecStep s = step(VecStepKind::binary, in0, in1, out);
    s.bin = b;
    return s;
  };
  auto un = [&](VecUnary u, int in0, int out) {
    VecStep s = step(VecStepKind::unary, in0, -1, out);
    s.un = u;
    return s;
  };
  struct Prog {
    const char* name;
    std::vector<VecStep> steps;
  };
  const std::vector<Prog> progs = {
      {"gelu(x * y + x)", {bin(VecBinary::mul, 0, 1, 3), bin(VecBinary::add, 3, 0, 4), un(VecUnary::gelu_erf, 4, 5)}},
      {"tanh(y + y * x)", {bin(VecBinary::mul, 1, 0, 3), bin(VecBinary::add, 1, 3, 4), un(VecUnary::tanh, 4, 5)}},
      {"exp(x + y)", {bin(VecBinary::add, 0, 1, 3), un(VecUnary::exp, 3, 4)}},
      {"sigmoid(x * y)", {bin(VecBinary::mul, 0, 1, 3), un(VecUnary::sigmoid, 3, 4)}},
      {"relu(x)", {un(VecUnary::relu, 0, 3)}},
      {"x - 0.5 y", [&] {
         VecStep s = bin(VecBinary::sub, 0, 1, 3);
         s.alpha = 0.5f;
         return std::vector<VecStep>{s};
       }()},
      {"sqrt(x)", {step(VecStepKind::sqrt, 0, -1, 3)}},
      {"copy(y)", {step(VecStepKind::copy, 1, -1, 3)}},
      // Not one pass: a scalar multiplier, a scalar alone, and two steps left after folding.
      {"gelu(x * s + y)", {bin(VecBinary::mul, 0, 2, 3), bin(VecBinary::add, 3, 1, 4), un(VecUnary::gelu_erf, 4, 5)}},
      {"x * s", {bin(VecBinary::mul, 0, 2, 3)}},
      {"exp(x) * y", {un(VecUnary::exp, 0, 3), bin(VecBinary::mul, 3, 1, 4)}},
  };
  for (const auto [t, own] : executors()) {
    INFO(t->name << (own ? " (its own executor)" : " (block executor)"));
    for (const Prog& p : progs) {
      INFO(p.name);
      check_program(t, own, p.steps, {p.steps.back().out});
    }
  }
}

TEST_CASE("vec_math: the run-time choice", "[elementwise][vecmath]") {
  const VecMathTable& best = tpu::ops::cpu::vec_math();
  if (std::getenv("TPU_CPU_ISA")) CHECK(&best == &tpu::ops::cpu::vec_math_capped(std::getenv("TPU_CPU_ISA")));
  else if (tpu::ops::cpu::vec_math_avx512()) CHECK(std::string(best.name) == "avx512");
  else if (tpu::ops::cpu::vec_math_avx2()) CHECK(std::string(best.name) == "avx2");
  else CHECK(std::string(best.name) == "scalar");
  // The explicit tables are what they say they are.
  CHECK(std::string(tpu::ops::cpu::vec_math_scalar().name) == "scalar");
  if (const VecMathTable* t = tpu::ops::cpu::vec_math_avx2()) CHECK(std::string(t->name) == "avx2");
  if (const VecMathTable* t = tpu::ops::cpu::vec_math_avx512()) CHECK(std::string(t->name) == "avx512");
}
