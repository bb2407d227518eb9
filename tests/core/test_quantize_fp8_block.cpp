// fp8 e4m3 weights with one scale per block of bn x bk (fine-grained fp8, as DeepSeek-V3 and
// Qwen3-FP8 publish it): linear_fp8 / dequantize_fp8 with block_n / block_k and the cpu kernel
// gemv_fp8_block on every path, against a naive loop over the bytes decoded from the format's
// definition, each weight multiplied by its block's scale in f32 (PyTorch's w.float() * s), the
// sums in double.
#include <cmath>

#include "codegen_testing.h"
#include "ops/cpu/kernels/gemv_int4.h"
#include "ops/cpu/kernels/gemv_int8.h"
#include "testing.h"
#include "tpucore/compile.h"
#include "tpucore/nn/quantized.h"
#include "tpucore/quantize.h"

namespace tpu::testing {
namespace {

// The value of an e4m3fn byte from the format's definition (bias 7, subnormals at exponent 0).
float fb_e4m3(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m) / 8.0f, -6) : std::ldexp(1 + static_cast<float>(m) / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}

struct FbCase {
  int64_t N, K, bn, bk;
  std::vector<uint8_t> q;  // [N, K]
  std::vector<float> s;    // [ceil(N / bn), ceil(K / bk)]
  int64_t nr() const { return (N + bn - 1) / bn; }
  int64_t nc() const { return (K + bk - 1) / bk; }
  // The dequantized f32 weight, as the format defines it.
  float w(int64_t j, int64_t k) const {
    return fb_e4m3(q[static_cast<size_t>(j * K + k)]) * s[static_cast<size_t>((j / bn) * nc() + k / bk)];
  }
};

FbCase fb_make(Generator& g, int64_t N, int64_t K, int64_t bn, int64_t bk) {
  FbCase c{N, K, bn, bk, {}, {}};
  c.q.resize(static_cast<size_t>(N * K));
  for (uint8_t& v : c.q) {
    v = static_cast<uint8_t>(g.next_u64() & 0xFF);
    if ((v & 0x7F) == 0x7F) v = static_cast<uint8_t>(v ^ 1);  // no NaN pattern
  }
  c.s.resize(static_cast<size_t>(c.nr() * c.nc()));
  // Scales spread over 2^-12 .. 2^3: a block whose scale were ignored or misplaced is far off.
  for (float& v : c.s) v = std::ldexp(1.0f + static_cast<float>(g.next_double()), static_cast<int>(g.next_u64() % 16) - 12);
  return c;
}

std::vector<float> fb_values(Generator& g, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(4 * g.next_double() - 2);
  return v;
}

// Counts outputs C [M, N] off the naive product by more than the f32 accumulation allows.
int fb_bad(const FbCase& c, const std::vector<float>& x, int64_t M, const std::vector<float>& got, double rel = 4e-6) {
  int bad = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p = static_cast<double>(x[static_cast<size_t>(i * c.K + k)]) * c.w(j, k);
        acc += p;
        mag += std::fabs(p);
      }
      bad += !(std::fabs(got[static_cast<size_t>(i * c.N + j)] - acc) <= rel * mag + 1e-30);
    }
  return bad;
}

struct FbShape {
  int64_t N, K, bn, bk;
};
// Blocks of 128 x 128 and small ones (16 x 32; 5 x 24: blocks of rows that cut the kernel's groups
// of four columns, blocks of columns that are not a multiple of the vector width); N and K never
// multiples of the block, so the last blocks are partial.
constexpr FbShape kFbShapes[] = {{130, 200, 128, 128}, {37, 70, 16, 32}, {9, 50, 5, 24}, {3, 7, 2, 3}};

TEST_CASE("linear_fp8 with block scales: every kernel path against the naive dequantize-then-f32 loop",
          "[quant][gemv][fp8block]") {
  using kernels::Int8GemvPath;
  Generator g(31);
  int checked = 0;
  for (const FbShape& sh : kFbShapes) {
    const FbCase c = fb_make(g, sh.N, sh.K, sh.bn, sh.bk);
    for (Int8GemvPath path : {Int8GemvPath::best, Int8GemvPath::avx512, Int8GemvPath::avx2, Int8GemvPath::scalar}) {
      if (!kernels::int8_gemv_path_available(path)) continue;
      for (int64_t M : {1, 3, 17, 33}) {
        const std::vector<float> x = fb_values(g, M * c.K);
        std::vector<float> out(static_cast<size_t>(M * c.N), -1);
        kernels::gemv_fp8_block(M, c.N, c.K, c.bn, c.bk, x.data(), c.K, c.q.data(), c.s.data(), out.data(), c.N, path);
        INFO("path " << static_cast<int>(path) << " M " << M << " N " << c.N << " K " << c.K << " block " << c.bn
                     << "x" << c.bk);
        CHECK(fb_bad(c, x, M, out) == 0);
        ++checked;
      }
    }
  }
  CHECK(checked >= 2 * 4 * 4);
}

TEST_CASE("linear_fp8 / dequantize_fp8 ops with block scales: f32 and bf16 inputs, batched shapes",
          "[quant][fp8block]") {
  Generator g(37);
  const FbCase c = fb_make(g, 37, 70, 16, 32);
  const Tensor q = from_vector(c.q, Shape{c.N, c.K}), s = from_vector(c.s, Shape{c.nr(), c.nc()});
  // The dequantized weight: exactly the f32 products.
  const std::vector<float> dq = dequantize_fp8(q, s, c.bn, c.bk).to_vector<float>();
  int bad = 0;
  for (int64_t j = 0; j < c.N; ++j)
    for (int64_t k = 0; k < c.K; ++k) bad += dq[static_cast<size_t>(j * c.K + k)] != c.w(j, k);
  CHECK(bad == 0);
  for (int64_t M : {1, 3, 17, 33}) {
    const std::vector<float> xv = fb_values(g, M * c.K);
    const Tensor y = linear_fp8(from_vector(xv, Shape{1, M, c.K}), q, s, c.bn, c.bk);
    REQUIRE(y.shape() == Shape{1, M, c.N});
    INFO("M " << M);
    CHECK(fb_bad(c, xv, M, y.to_vector<float>()) == 0);
  }
  // bf16 activations: widened exactly, the result rounded once to bf16.
  const Tensor xb = from_vector(fb_values(g, 3 * c.K), Shape{3, c.K}).to(DType::bf16);
  const Tensor yb = linear_fp8(xb, Fp8Weight{q, s, c.bn, c.bk});
  CHECK(yb.dtype() == DType::bf16);
  const std::vector<float> xs = xb.to_vector<float>(), got = yb.to_vector<float>();
  CHECK(fb_bad(c, xs, 3, got, 0x1p-8) == 0);
  // nn::QuantizedLinear over the bytes and block scales, with a bias.
  const std::vector<float> bias = fb_values(g, c.N);
  nn::QuantizedLinear ql(q, s, from_vector(bias, Shape{c.N}), c.bn, c.bk);
  CHECK(ql.weight.nbytes() == static_cast<size_t>(c.N * c.K));
  const std::vector<float> x1 = fb_values(g, c.K);
  std::vector<float> y1 = ql.forward(from_vector(x1, Shape{c.K})).to_vector<float>();
  for (int64_t j = 0; j < c.N; ++j) y1[static_cast<size_t>(j)] -= bias[static_cast<size_t>(j)];
  CHECK(fb_bad(c, x1, 1, y1, 1e-5) == 0);
}

TEST_CASE("linear_fp8 with block scales: scales of the wrong shape are an error naming both shapes", "[quant][fp8block]") {
  Generator g(41);
  const FbCase c = fb_make(g, 37, 70, 16, 32);  // scales [3, 3]
  const Tensor q = from_vector(c.q, Shape{c.N, c.K});
  const Tensor x = from_vector(fb_values(g, c.K), Shape{1, c.K});
  const Tensor wrong = from_vector(std::vector<float>(6, 1.0f), Shape{2, 3});
  CHECK_THROWS_WITH(linear_fp8(x, q, wrong, c.bn, c.bk),
                    Catch::Contains("block scales of shape [3, 3]") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(dequantize_fp8(q, wrong, c.bn, c.bk), Catch::Contains("[3, 3]") && Catch::Contains("[2, 3]"));
  // Per-row scales given with a block size, and block scales without one.
  CHECK_THROWS_WITH(linear_fp8(x, q, from_vector(std::vector<float>(37, 1.0f), Shape{37}), c.bn, c.bk),
                    Catch::Contains("[3, 3]") && Catch::Contains("[37]"));
  CHECK_THROWS_WITH(linear_fp8(x, q, from_vector(std::vector<float>(9, 1.0f), Shape{3, 3})),
                    Catch::Contains("one per output feature"));
  CHECK_THROWS_WITH(nn::QuantizedLinear(q, wrong, Tensor(), c.bn, c.bk),
                    Catch::Contains("[3, 3]") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(nn::QuantizedLinear(q, wrong, Tensor(), c.bn, 0), Catch::Contains("both be positive"));
}

TEST_CASE("linear_fp8 with block scales on the chip: the host kernel's values, counted as a fallback",
          "[quant][sim][fp8block]") {
  TinySim sim;
  Generator g(43);
  const FbCase c = fb_make(g, 37, 70, 16, 32);
  const int64_t M = 3;
  const std::vector<float> xv = fb_values(g, M * c.K);
  const Tensor q = from_vector(c.q, Shape{c.N, c.K}).to(sim.dev()), s = from_vector(c.s, Shape{c.nr(), c.nc()}).to(sim.dev());
  const Tensor x = from_vector(xv, Shape{M, c.K}).to(sim.dev());
  (void)linear_fp8(x, q, s, c.bn, c.bk).to_vector<float>();
  ChipRunProbe probe;
  const Tensor y = linear_fp8(x, q, s, c.bn, c.bk);
  CHECK(y.device() == sim.dev());
  CHECK(fb_bad(c, xv, M, y.to_vector<float>()) == 0);
  CHECK(probe.new_fallbacks() == 1);
  // In a compiled function: the node keeps its block attributes and the same values.
  auto f = tpu::compile([&](const Tensor& a) { return linear_fp8(a, q, s, c.bn, c.bk); });
  (void)f(x).to_vector<float>();
  CHECK(fb_bad(c, xv, M, f(x).to_vector<float>()) == 0);
}

}  // namespace
}  // namespace tpu::testing
