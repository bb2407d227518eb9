// Batch-invariant mode (tpucore/core/batch_invariant.h): a host product of M rows equals, bit
// for bit, the same product computed one row at a time, for M = 1..40 and several shapes
// (K within one cache block and across several, ragged N), f32 and bf16, through the
// dispatched kernels and the forced AVX2 and portable paths; B both as W^T of a linear layer
// (the GEMV layout) and row-major; odd shapes, strided A and accumulation into C (also against
// a naive loop in double); the hand-over from the few-row kernel to the packed GEMM of many
// rows; the widened bf16 path of AVX-512 CPUs without avx512_bf16; the int8-weight products on
// each of their paths. The reference is the product of each single row (a different call: a
// single-row product is what a request computes alone).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/gemv.h"
#include "ops/cpu/kernels/gemv_int8.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/core/tensor.h"
#include "tpucore/ops.h"

namespace {

using GemmF32 = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t,
                         float*, int64_t, bool);
using GemmBf16 = void (*)(int64_t, int64_t, int64_t, const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t,
                          int64_t, float*, int64_t, bool);

uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return static_cast<uint16_t>(b >> 16);  // truncation: any bf16 value will do
}

// Counts the (row, column) results of the M-row product that differ in any bit from the same
// row computed alone.
template <class T, class Fn>
int64_t mismatches(Fn gemm, int64_t M, int64_t N, int64_t K, bool transposed, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  auto value = [&] {
    if constexpr (sizeof(T) == 2) return to_bf16(d(rng));
    else return d(rng);
  };
  std::vector<T> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N));
  for (auto& x : a) x = value();
  for (auto& x : b) x = value();
  // transposed: B = W^T with W [N, K] row-major (b_rs 1, b_cs K); else B [K, N] row-major.
  const int64_t b_rs = transposed ? 1 : N, b_cs = transposed ? K : 1;
  std::vector<float> all(static_cast<size_t>(M * N)), one(static_cast<size_t>(N));
  gemm(M, N, K, a.data(), K, 1, b.data(), b_rs, b_cs, all.data(), N, false);
  int64_t bad = 0;
  for (int64_t i = 0; i < M; ++i) {
    gemm(1, N, K, a.data() + i * K, K, 1, b.data(), b_rs, b_cs, one.data(), N, false);
    bad += std::memcmp(one.data(), all.data() + i * N, sizeof(float) * static_cast<size_t>(N)) != 0 ? 1 : 0;
  }
  return bad;
}

struct KN {
  int64_t N, K;
};
// Small K (one K block, below the GEMV and direct-loop thresholds too), typical hidden sizes, a
// K across several cache blocks (kc is at most 1024 k-steps), ragged N.
const KN kShapes[] = {{5, 3}, {24, 16}, {64, 64}, {96, 160}, {33, 257}, {40, 2500}};

template <class T, class Fn>
void check_path(const char* name, Fn gemm) {
  tpu::BatchInvariantScope invariant;
  for (const KN& s : kShapes)
    for (bool transposed : {true, false})
      for (int64_t M = 1; M <= 40; ++M) {
        INFO(name << " M " << M << " N " << s.N << " K " << s.K << " transposed " << transposed);
        CHECK(mismatches<T>(gemm, M, s.N, s.K, transposed, static_cast<uint32_t>(M * 7 + s.K)) == 0);
      }
}

}  // namespace

TEST_CASE("batch-invariant mode: every row of a product equals the row alone (dispatched kernels)",
          "[gemm][batch-invariant]") {
  CHECK_FALSE(tpu::batch_invariant());
  check_path<float>(tpu::kernels::gemm_f32_kernel_name(), static_cast<GemmF32>(tpu::kernels::gemm_f32));
  check_path<uint16_t>(tpu::kernels::gemm_bf16_kernel_name(), static_cast<GemmBf16>(tpu::kernels::gemm_bf16));
  CHECK_FALSE(tpu::batch_invariant());
}

TEST_CASE("batch-invariant mode: the forced AVX2 and portable paths", "[gemm][batch-invariant]") {
  check_path<float>("generic f32", static_cast<GemmF32>(tpu::kernels::gemm_f32_generic));
  check_path<uint16_t>("generic bf16", static_cast<GemmBf16>(tpu::kernels::gemm_bf16_generic));
  if (!tpu::kernels::gemm_avx2_available()) {
    WARN("no AVX2 + FMA on this CPU: its paths are not checked");
    return;
  }
  check_path<float>("avx2 f32", static_cast<GemmF32>(tpu::kernels::gemm_f32_avx2));
  check_path<uint16_t>("avx2 bf16", static_cast<GemmBf16>(tpu::kernels::gemm_bf16_avx2));
}

TEST_CASE("batch-invariant mode: scopes nest and count across threads", "[batch-invariant]") {
  CHECK_FALSE(tpu::batch_invariant());
  {
    tpu::BatchInvariantScope a;
    {
      tpu::BatchInvariantScope off(false);
      CHECK(tpu::batch_invariant());
      tpu::BatchInvariantScope b;
      CHECK(tpu::batch_invariant());
    }
    CHECK(tpu::batch_invariant());
  }
  CHECK_FALSE(tpu::batch_invariant());
}

TEST_CASE("batch-invariant mode: matmul of x [M, K] by W^T equals each row's matmul", "[matmul][batch-invariant]") {
  tpu::BatchInvariantScope invariant;
  for (tpu::DType dt : {tpu::DType::f32, tpu::DType::bf16}) {
    tpu::Generator g(3);
    const tpu::Tensor w = tpu::randn({48, 96}, {}, &g).to(dt);  // a linear layer's [out, in]
    for (int64_t M : {1, 2, 5, 16, 17, 33}) {
      const tpu::Tensor x = tpu::randn({M, 96}, {}, &g).to(dt);
      const tpu::Tensor y = tpu::matmul(x, w.t()).to(tpu::DType::f32).contiguous();
      for (int64_t i = 0; i < M; ++i) {
        const tpu::Tensor yi = tpu::matmul(tpu::slice(x, 0, i, i + 1), w.t()).to(tpu::DType::f32).contiguous();
        INFO("dtype " << tpu::dtype_name(dt) << " M " << M << " row " << i);
        CHECK(std::memcmp(yi.data<float>(), y.data<float>() + i * 48, sizeof(float) * 48) == 0);
      }
    }
  }
}

TEST_CASE("batch-invariant mode: int8-weight products, M rows equal each row alone on every path",
          "[gemm][batch-invariant]") {
  tpu::BatchInvariantScope invariant;
  using tpu::kernels::Int8GemvPath;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::uniform_int_distribution<int> q(-127, 127);
  for (Int8GemvPath path : {Int8GemvPath::best, Int8GemvPath::vnni, Int8GemvPath::avx2q8, Int8GemvPath::avx512, Int8GemvPath::avx2,
        Int8GemvPath::scalar}) {
    if (!tpu::kernels::int8_gemv_path_available(path)) continue;
    for (const KN& s : {KN{5, 3}, KN{33, 257}, KN{64, 96}}) {
      std::vector<int8_t> w(static_cast<size_t>(s.N * s.K));
      std::vector<float> scale(static_cast<size_t>(s.N));
      for (auto& x : w) x = static_cast<int8_t>(q(rng));
      for (auto& x : scale) x = 0.01f + 0.001f * static_cast<float>(q(rng) + 127);
      for (int64_t M = 1; M <= 40; ++M) {
        std::vector<float> a(static_cast<size_t>(M * s.K)), all(static_cast<size_t>(M * s.N)), one(static_cast<size_t>(s.N));
        for (auto& x : a) x = d(rng);
        tpu::kernels::gemv_int8(M, s.N, s.K, a.data(), s.K, w.data(), scale.data(), all.data(), s.N, path);
        int64_t bad = 0;
        for (int64_t i = 0; i < M; ++i) {
          tpu::kernels::gemv_int8(1, s.N, s.K, a.data() + i * s.K, s.K, w.data(), scale.data(), one.data(), s.N, path);
          bad += std::memcmp(one.data(), all.data() + i * s.N, sizeof(float) * static_cast<size_t>(s.N)) != 0 ? 1 : 0;
        }
        INFO("int8 path " << static_cast<int>(path) << " M " << M << " N " << s.N << " K " << s.K);
        CHECK(bad == 0);
      }
    }
  }
}

namespace {

// One product through `gemm` with A strided (row stride a_rs, column stride a_cs) and, when
// accumulating, C holding earlier values: the M-row product, each row alone, and a naive loop in
// double. Returns the rows that differ in any bit from the row alone; `worst` gets the largest
// error against the naive loop relative to sum_k |a b| (+ |C_in|).
template <class T, class Fn>
int64_t strided_mismatches(Fn gemm, int64_t M, int64_t N, int64_t K, int64_t a_rs, int64_t a_cs, bool accumulate,
                           uint32_t seed, double& worst) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  auto value = [&] {
    if constexpr (sizeof(T) == 2) return to_bf16(d(rng));
    else return d(rng);
  };
  auto as_f32 = [](T v) {
    if constexpr (sizeof(T) == 2) {
      const uint32_t bits = static_cast<uint32_t>(v) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    } else {
      return v;
    }
  };
  std::vector<T> a(static_cast<size_t>((M - 1) * a_rs + (K - 1) * a_cs + 1)), w(static_cast<size_t>(N * K));
  for (auto& x : a) x = value();
  for (auto& x : w) x = value();
  const int64_t ldc = N + 3;  // C rows with a gap too
  std::vector<float> c0(static_cast<size_t>(M * ldc));
  for (auto& x : c0) x = accumulate ? d(rng) : 7.0f;  // overwritten when not accumulating
  std::vector<float> all = c0;
  gemm(M, N, K, a.data(), a_rs, a_cs, w.data(), 1, K, all.data(), ldc, accumulate);
  int64_t bad = 0;
  for (int64_t i = 0; i < M; ++i) {
    std::vector<float> one(c0.begin() + i * ldc, c0.begin() + (i + 1) * ldc);
    gemm(1, N, K, a.data() + i * a_rs, a_rs, a_cs, w.data(), 1, K, one.data(), ldc, accumulate);
    bad += std::memcmp(one.data(), all.data() + i * ldc, sizeof(float) * static_cast<size_t>(N)) != 0 ? 1 : 0;
    for (int64_t j = 0; j < N; ++j) {
      const double cin = accumulate ? c0[static_cast<size_t>(i * ldc + j)] : 0.0;
      double ref = cin, mag = std::abs(cin);
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(as_f32(a[static_cast<size_t>(i * a_rs + k * a_cs)])) * as_f32(w[static_cast<size_t>(j * K + k)]);
        ref += p;
        mag += std::abs(p);
      }
      worst = std::max(worst, std::abs(all[static_cast<size_t>(i * ldc + j)] - ref) / (mag + 1e-30));
    }
  }
  return bad;
}

template <class T, class Fn>
void check_strided(const char* name, Fn gemm) {
  tpu::BatchInvariantScope invariant;
  // Odd N and K; one K block (every M from 1 to 33), and K across blocks (kc is 512 k-steps on
  // a 32 KiB L1d, 768 on 48 KiB; a bf16 k-step is two values) for a sample of M.
  const std::vector<int64_t> all_m = [] {
    std::vector<int64_t> v;
    for (int64_t M = 1; M <= 33; ++M) v.push_back(M);
    return v;
  }();
  const std::vector<int64_t> some_m = {1, 2, 3, 4, 5, 8, 13, 16, 17, 29, 33};
  for (const KN& s : {KN{37, 19}, KN{29, 1601}})
    for (int64_t a_cs : {1, 2})
      for (bool accumulate : {false, true}) {
        const int64_t a_rs = s.K * a_cs + 5;
        double worst = 0;
        for (int64_t M : s.K < 100 ? all_m : some_m) {
          INFO(name << " M " << M << " N " << s.N << " K " << s.K << " a_cs " << a_cs << " accumulate " << accumulate);
          CHECK(strided_mismatches<T>(gemm, M, s.N, s.K, a_rs, a_cs, accumulate, static_cast<uint32_t>(M + s.K), worst) == 0);
        }
        INFO(name << " N " << s.N << " K " << s.K << " a_cs " << a_cs << " accumulate " << accumulate);
        CHECK(worst < 1e-5);  // f32 accumulation of K products (bf16 inputs are exact in f32)
      }
}

}  // namespace

TEST_CASE("batch-invariant mode: odd shapes, strided A and accumulation, M = 1..33 against each row alone and a naive loop",
          "[gemm][batch-invariant]") {
  check_strided<float>(tpu::kernels::gemm_f32_kernel_name(), static_cast<GemmF32>(tpu::kernels::gemm_f32));
  check_strided<uint16_t>(tpu::kernels::gemm_bf16_kernel_name(), static_cast<GemmBf16>(tpu::kernels::gemm_bf16));
  // (CTest runs this file again with TPU_CPU_FEATURES=avx2: the dispatch of an AVX2-only CPU.)
}

TEST_CASE("batch-invariant mode: the few-row kernel and the packed GEMM of many rows give the same bits",
          "[gemm][batch-invariant]") {
  // 129 and more rows leave the few-row (broadcast) kernel for the packed GEMM: a row of such a
  // product equals the row alone, which the few-row kernel computes; K spans several K blocks.
  tpu::BatchInvariantScope invariant;
  for (int64_t M : {129, 150}) {
    double worst = 0;
    INFO("M " << M);
    CHECK(strided_mismatches<float>(static_cast<GemmF32>(tpu::kernels::gemm_f32), M, 9, 1601, 1601, 1, false, 11, worst) == 0);
    CHECK(strided_mismatches<uint16_t>(static_cast<GemmBf16>(tpu::kernels::gemm_bf16), M, 9, 1601, 1601, 1, true, 12, worst) == 0);
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("batch-invariant mode: bf16 widened to f32 (AVX-512 without avx512_bf16) equals the f32 product of the widened values",
          "[gemm][batch-invariant]") {
  // The bf16 path of an AVX-512 CPU without avx512_bf16 packs the widened values for the f32
  // micro-kernel: its few-row kernel must sum as the f32 GEMM does on those values, for few rows
  // (the f32 few-row kernel) and many (the packed f32 GEMM), across K blocks.
  tpu::BatchInvariantScope invariant;
  const int64_t N = 11, K = 1301, kc = tpu::kernels::detail::gemm_blocking_f32().kc;
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (int64_t M : {1, 3, 16, 17, 40}) {
    std::vector<uint16_t> a(static_cast<size_t>(M * K)), w(static_cast<size_t>(N * K));
    for (auto& x : a) x = to_bf16(d(rng));
    for (auto& x : w) x = to_bf16(d(rng));
    std::vector<float> af(a.size()), wf(w.size());
    auto widen = [](uint16_t v) {
      const uint32_t bits = static_cast<uint32_t>(v) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    };
    std::transform(a.begin(), a.end(), af.begin(), widen);
    std::transform(w.begin(), w.end(), wf.begin(), widen);
    std::vector<float> got(static_cast<size_t>(M * N)), want(got.size());
    tpu::kernels::gemm_f32(M, N, K, af.data(), K, 1, wf.data(), 1, K, want.data(), N, false);
    const bool ran = tpu::kernels::gemv_chain_bf16_widened(M, N, K, a.data(), K, 1, w.data(), 1, K, got.data(), N, false, kc);
    if (!ran) {
      WARN("the AVX-512 few-row kernel does not run here (no AVX-512, or M " << M << " beyond it)");
      continue;
    }
    INFO("M " << M);
    CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * got.size()) == 0);
  }
}
