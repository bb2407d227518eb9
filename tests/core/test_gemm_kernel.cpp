// Host GEMM kernels (ops/cpu/kernels/gemm.h) against a naive triple loop accumulated in
// double, over ragged sizes, strided and transposed operands, accumulate on/off, zero sizes,
// for the dispatched kernels (AVX-512 or AVX2 where present), the AVX2 ones called explicitly
// (skipped with a warning on CPUs without AVX2+FMA) and the portable ones.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/scratch.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/parallel.h"

namespace {

using tpu::kernels::gemm_bf16;
using tpu::kernels::gemm_bf16_avx2;
using tpu::kernels::gemm_bf16_generic;
using tpu::kernels::gemm_f32_avx2;
using tpu::kernels::gemm_f32;
using tpu::kernels::gemm_f32_generic;

float bf16_bits_to_float(uint16_t v) {
  const uint32_t b = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
// Truncation is enough here: the test only needs some bf16 values, not a rounding rule.
uint16_t float_to_bf16_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return static_cast<uint16_t>(b >> 16);
}

// An operand of logical shape rows x cols stored in a larger buffer with the given layout.
enum class Layout { RowMajor, ColMajor, Strided };

template <class T>
struct Operand {
  std::vector<T> buf;
  int64_t rs = 0, cs = 0;
  const T* ptr() const { return buf.data(); }
};

template <class T, class Gen>
Operand<T> make_operand(int64_t rows, int64_t cols, Layout layout, Gen&& gen) {
  Operand<T> op;
  switch (layout) {
    case Layout::RowMajor: op.rs = cols; op.cs = 1; break;
    case Layout::ColMajor: op.rs = 1; op.cs = rows; break;
    case Layout::Strided:  op.rs = 3 * cols + 5; op.cs = 3; break;  // every third element
  }
  const int64_t extent = (rows > 0 && cols > 0) ? (rows - 1) * op.rs + (cols - 1) * op.cs + 1 : 1;
  op.buf.assign(static_cast<size_t>(extent), T{});
  // Fill everything (including the gaps) so a kernel reading a gap gets a wrong answer.
  for (auto& v : op.buf) v = gen();
  return op;
}

const char* layout_name(Layout l) {
  return l == Layout::RowMajor ? "row" : (l == Layout::ColMajor ? "col" : "strided");
}

// C (M x N, leading dimension ldc) = [C +] A*B, summed in double.
template <class T, class ToF>
std::vector<double> reference(int64_t M, int64_t N, int64_t K, const Operand<T>& A,
                              const Operand<T>& B, const std::vector<float>& C0, int64_t ldc,
                              bool accumulate, ToF to_f) {
  std::vector<double> R(static_cast<size_t>(M * ldc), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = accumulate ? C0[i * ldc + j] : 0.0;
      for (int64_t k = 0; k < K; ++k)
        s += double(to_f(A.buf[i * A.rs + k * A.cs])) * double(to_f(B.buf[k * B.rs + j * B.cs]));
      R[i * ldc + j] = s;
    }
  return R;
}

// Checks C against R; elements past column N of each row (the ldc padding) must be untouched.
void check_close(int64_t M, int64_t N, int64_t K, int64_t ldc, const std::vector<float>& C,
                 const std::vector<double>& R, const std::vector<float>& C0, double rel_tol) {
  int64_t bad = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = static_cast<size_t>(i * ldc + j);
      if (j >= N) {
        if (std::memcmp(&C[at], &C0[at], sizeof(float)) != 0) ++bad;
        continue;
      }
      const double tol = rel_tol * (std::sqrt(double(K)) + 1.0) * (1.0 + std::fabs(R[at]));
      if (!(std::fabs(double(C[at]) - R[at]) <= tol)) {
        if (bad < 3) UNSCOPED_INFO("C[" << i << "," << j << "] = " << C[at] << ", want " << R[at]);
        ++bad;
      }
    }
  }
  CHECK(bad == 0);
}

using GemmF32Fn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, int64_t,
                           const float*, int64_t, int64_t, float*, int64_t, bool);
using GemmBf16Fn = void (*)(int64_t, int64_t, int64_t, const uint16_t*, int64_t, int64_t,
                            const uint16_t*, int64_t, int64_t, float*, int64_t, bool);

struct GemmCase {
  int64_t M, N, K;
};

const std::vector<GemmCase>& ragged_cases() {
  static const std::vector<GemmCase> cases = {
      {1, 1, 1},    {1, 7, 3},     {7, 1, 5},    {7, 17, 33},  {17, 33, 7},  {14, 32, 64},
      {15, 33, 65}, {33, 65, 17},  {65, 31, 100}, {100, 100, 1}, {3, 200, 129}, {200, 5, 77},
      {29, 97, 200}, {128, 96, 160}, {1, 130, 190}, {130, 1, 190}, {45, 64, 2}};
  return cases;
}

template <class T, class Gen, class ToF, class Fn>
void run_cases(Fn fn, Gen&& gen, ToF to_f, double rel_tol) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> cdist(-2.0f, 2.0f);
  const Layout layouts[] = {Layout::RowMajor, Layout::ColMajor, Layout::Strided};
  int which = 0;
  for (const GemmCase& cs : ragged_cases()) {
    for (Layout la : layouts) {
      for (Layout lb : layouts) {
        // Every case runs row-major x row-major; other layout pairs rotate over the cases
        // to keep the test fast.
        const bool both_row = la == Layout::RowMajor && lb == Layout::RowMajor;
        if (!both_row && (which++ % 3) != 0) continue;
        for (bool accumulate : {false, true}) {
          INFO("M=" << cs.M << " N=" << cs.N << " K=" << cs.K << " A " << layout_name(la)
                    << " B " << layout_name(lb) << " accumulate=" << accumulate);
          const Operand<T> A = make_operand<T>(cs.M, cs.K, la, gen);
          const Operand<T> B = make_operand<T>(cs.K, cs.N, lb, gen);
          const int64_t ldc = cs.N + 3;
          std::vector<float> C0(static_cast<size_t>(cs.M * ldc));
          for (auto& v : C0) v = cdist(rng);
          std::vector<float> C = C0;
          fn(cs.M, cs.N, cs.K, A.ptr(), A.rs, A.cs, B.ptr(), B.rs, B.cs, C.data(), ldc,
             accumulate);
          const auto R = reference(cs.M, cs.N, cs.K, A, B, C0, ldc, accumulate, to_f);
          check_close(cs.M, cs.N, cs.K, ldc, C, R, C0, rel_tol);
        }
      }
    }
  }
}

template <class T, class Fn>
void run_zero_sizes(Fn fn) {
  const T a[4] = {}, b[4] = {};
  // K == 0: zeros, or C unchanged when accumulating.
  std::vector<float> C(6, 5.0f);
  fn(2, 3, 0, a, 1, 1, b, 1, 1, C.data(), 3, false);
  for (float v : C) CHECK(v == 0.0f);
  std::fill(C.begin(), C.end(), 5.0f);
  fn(2, 3, 0, a, 1, 1, b, 1, 1, C.data(), 3, true);
  for (float v : C) CHECK(v == 5.0f);
  // M == 0 or N == 0: nothing is touched (C may even be null).
  fn(0, 3, 4, a, 4, 1, b, 3, 1, nullptr, 3, false);
  fn(2, 0, 4, a, 4, 1, b, 1, 1, nullptr, 1, false);
  fn(0, 0, 0, nullptr, 0, 0, nullptr, 0, 0, nullptr, 0, true);
}

auto f32_gen() {
  auto rng = std::make_shared<std::mt19937>(42);
  return [rng] { return std::uniform_real_distribution<float>(-1.0f, 1.0f)(*rng); };
}
auto bf16_gen() {
  auto rng = std::make_shared<std::mt19937>(43);
  return [rng] {
    return float_to_bf16_bits(std::uniform_real_distribution<float>(-1.0f, 1.0f)(*rng));
  };
}
float f32_id(float v) { return v; }

bool avx2_or_skip() {
  if (tpu::kernels::gemm_avx2_available()) return true;
  WARN("AVX2 GEMM kernels skipped: this CPU lacks AVX2+FMA (or TPU_CPU_FEATURES=generic)");
  return false;
}

}  // namespace

TEST_CASE("gemm_f32 matches a naive loop (dispatched kernel)", "[gemm]") {
  INFO("kernel: " << tpu::kernels::gemm_f32_kernel_name());
  run_cases<float>(GemmF32Fn(gemm_f32), f32_gen(), f32_id, 1e-6);
}

TEST_CASE("gemm_f32 matches a naive loop (portable kernel)", "[gemm]") {
  run_cases<float>(GemmF32Fn(gemm_f32_generic), f32_gen(), f32_id, 1e-6);
}

TEST_CASE("gemm_f32 matches a naive loop (AVX2 kernel)", "[gemm][avx2]") {
  if (!avx2_or_skip()) return;
  run_cases<float>(GemmF32Fn(gemm_f32_avx2), f32_gen(), f32_id, 1e-6);
}

TEST_CASE("gemm_bf16 matches a naive loop over the bf16 values (AVX2 kernel)", "[gemm][avx2]") {
  if (!avx2_or_skip()) return;
  run_cases<uint16_t>(GemmBf16Fn(gemm_bf16_avx2), bf16_gen(), bf16_bits_to_float, 1e-6);
}

TEST_CASE("gemm_f32 AVX2: every ragged tile edge, layouts and accumulate", "[gemm][avx2]") {
  if (!avx2_or_skip()) return;
  // Rows 1..13 against the 6-row tile and columns 1..33 against the 16-column tile, K below,
  // at and above the 8-wide packing step, with row-major, transposed and strided operands.
  auto gen = f32_gen();
  const Layout layouts[] = {Layout::RowMajor, Layout::ColMajor, Layout::Strided};
  int which = 0;
  for (int64_t M : {1, 2, 5, 6, 7, 11, 12, 13}) {
    for (int64_t N : {1, 3, 8, 9, 15, 16, 17, 31, 33}) {
      for (int64_t K : {1, 7, 8, 9, 24}) {
        const Layout la = layouts[which % 3], lb = layouts[(which / 3) % 3];
        const bool accumulate = (which & 1) != 0;
        ++which;
        INFO("M=" << M << " N=" << N << " K=" << K << " A " << layout_name(la) << " B "
                  << layout_name(lb) << " accumulate=" << accumulate);
        const Operand<float> A = make_operand<float>(M, K, la, gen);
        const Operand<float> B = make_operand<float>(K, N, lb, gen);
        const int64_t ldc = N + 5;
        std::vector<float> C0(static_cast<size_t>(M * ldc));
        for (size_t i = 0; i < C0.size(); ++i) C0[i] = float(int(i % 5) - 2);
        std::vector<float> C = C0;
        gemm_f32_avx2(M, N, K, A.ptr(), A.rs, A.cs, B.ptr(), B.rs, B.cs, C.data(), ldc, accumulate);
        check_close(M, N, K, ldc, C, reference(M, N, K, A, B, C0, ldc, accumulate, f32_id), C0, 1e-6);
      }
    }
  }
}

TEST_CASE("gemm_bf16 matches a naive loop over the bf16 values (dispatched kernel)", "[gemm]") {
  INFO("kernel: " << tpu::kernels::gemm_bf16_kernel_name());
  run_cases<uint16_t>(GemmBf16Fn(gemm_bf16), bf16_gen(), bf16_bits_to_float, 1e-6);
}

TEST_CASE("gemm_bf16 matches a naive loop over the bf16 values (portable kernel)", "[gemm]") {
  run_cases<uint16_t>(GemmBf16Fn(gemm_bf16_generic), bf16_gen(), bf16_bits_to_float, 1e-6);
}

TEST_CASE("gemm kernels handle zero sizes", "[gemm]") {
  run_zero_sizes<float>(GemmF32Fn(gemm_f32));
  run_zero_sizes<float>(GemmF32Fn(gemm_f32_generic));
  run_zero_sizes<uint16_t>(GemmBf16Fn(gemm_bf16));
  run_zero_sizes<uint16_t>(GemmBf16Fn(gemm_bf16_generic));
  if (avx2_or_skip()) {
    run_zero_sizes<float>(GemmF32Fn(gemm_f32_avx2));
    run_zero_sizes<uint16_t>(GemmBf16Fn(gemm_bf16_avx2));
  }
}

TEST_CASE("gemm kernels: multi-threaded sizes and broadcast (zero-stride) operands", "[gemm]") {
  // Big enough to take the threaded path, with one dimension ragged against the tiles.
  const int64_t M = 150, N = 190, K = 120;
  auto gen = f32_gen();
  for (bool tall : {false, true}) {
    const int64_t m = tall ? N : M, n = tall ? M : N;  // split along rows, then columns
    const Operand<float> A = make_operand<float>(m, K, Layout::RowMajor, gen);
    const Operand<float> B = make_operand<float>(K, n, Layout::ColMajor, gen);
    std::vector<float> C0(static_cast<size_t>(m * n), 1.0f), C = C0;
    gemm_f32(m, n, K, A.ptr(), A.rs, A.cs, B.ptr(), B.rs, B.cs, C.data(), n, true);
    check_close(m, n, K, n, C, reference(m, n, K, A, B, C0, n, true, f32_id), C0, 1e-6);
  }
  // A whose rows are all the same row (row stride 0), B with a zero column stride.
  Operand<float> A = make_operand<float>(1, K, Layout::RowMajor, gen);
  A.rs = 0;
  Operand<float> B = make_operand<float>(K, 1, Layout::RowMajor, gen);
  B.cs = 0;
  std::vector<float> C0(static_cast<size_t>(M * N), 0.0f), C = C0;
  gemm_f32(M, N, K, A.ptr(), A.rs, A.cs, B.ptr(), B.rs, B.cs, C.data(), N, false);
  check_close(M, N, K, N, C, reference(M, N, K, A, B, C0, N, false, f32_id), C0, 1e-6);
}

TEST_CASE("gemm_bf16: odd K and exact small-integer products", "[gemm]") {
  // Small integers are exact in bf16 and their products and sums are exact in f32, so the
  // result must equal the reference exactly, whatever the pairing along K.
  for (int64_t K : {1, 2, 3, 31, 64, 129}) {
    const int64_t M = 9, N = 35;
    std::vector<uint16_t> A(static_cast<size_t>(M * K)), B(static_cast<size_t>(K * N));
    for (int64_t i = 0; i < M * K; ++i) A[i] = float_to_bf16_bits(float((i * 7) % 9) - 4.0f);
    for (int64_t i = 0; i < K * N; ++i) B[i] = float_to_bf16_bits(float((i * 5) % 7) - 3.0f);
    std::vector<GemmBf16Fn> fns = {GemmBf16Fn(gemm_bf16), GemmBf16Fn(gemm_bf16_generic)};
    if (tpu::kernels::gemm_avx2_available()) fns.push_back(GemmBf16Fn(gemm_bf16_avx2));
    for (GemmBf16Fn fn : fns) {
      std::vector<float> C(static_cast<size_t>(M * N), -1.0f);
      fn(M, N, K, A.data(), K, 1, B.data(), N, 1, C.data(), N, false);
      int64_t bad = 0;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          float want = 0.0f;
          for (int64_t k = 0; k < K; ++k)
            want += bf16_bits_to_float(A[i * K + k]) * bf16_bits_to_float(B[k * N + j]);
          if (C[i * N + j] != want) ++bad;
        }
      INFO("K=" << K);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("gemm kernels: several K blocks, several column blocks, threaded K blocks", "[gemm]") {
  // K beyond one cache block (so later blocks accumulate into C), N beyond one column
  // block, a product big enough to be threaded with several K blocks (rows split), and a
  // short wide one that is threaded by columns.
  const std::vector<GemmCase> cases = {{20, 40, 1100}, {3, 2100, 5}, {5, 4200, 3},
                                   {150, 120, 800}, {40, 300, 100}};
  auto fgen = f32_gen();
  auto bgen = bf16_gen();
  std::vector<GemmF32Fn> f32_fns = {GemmF32Fn(gemm_f32), GemmF32Fn(gemm_f32_generic)};
  std::vector<GemmBf16Fn> bf16_fns = {GemmBf16Fn(gemm_bf16), GemmBf16Fn(gemm_bf16_generic)};
  if (avx2_or_skip()) {
    f32_fns.push_back(GemmF32Fn(gemm_f32_avx2));
    bf16_fns.push_back(GemmBf16Fn(gemm_bf16_avx2));
  }
  for (const GemmCase& cs : cases) {
    for (bool accumulate : {false, true}) {
      INFO("M=" << cs.M << " N=" << cs.N << " K=" << cs.K << " accumulate=" << accumulate);
      const int64_t ldc = cs.N + 1;
      std::vector<float> C0(static_cast<size_t>(cs.M * ldc));
      for (size_t i = 0; i < C0.size(); ++i) C0[i] = float(int(i % 7) - 3);
      {
        const Operand<float> A = make_operand<float>(cs.M, cs.K, Layout::RowMajor, fgen);
        const Operand<float> B = make_operand<float>(cs.K, cs.N, Layout::RowMajor, fgen);
        const auto R = reference(cs.M, cs.N, cs.K, A, B, C0, ldc, accumulate, f32_id);
        for (GemmF32Fn fn : f32_fns) {
          std::vector<float> C = C0;
          fn(cs.M, cs.N, cs.K, A.ptr(), A.rs, A.cs, B.ptr(), B.rs, B.cs, C.data(), ldc,
             accumulate);
          check_close(cs.M, cs.N, cs.K, ldc, C, R, C0, 1e-6);
        }
      }
      {
        const Operand<uint16_t> A = make_operand<uint16_t>(cs.M, cs.K, Layout::RowMajor, bgen);
        const Operand<uint16_t> B = make_operand<uint16_t>(cs.K, cs.N, Layout::ColMajor, bgen);
        const auto R = reference(cs.M, cs.N, cs.K, A, B, C0, ldc, accumulate, bf16_bits_to_float);
        for (GemmBf16Fn fn : bf16_fns) {
          std::vector<float> C = C0;
          fn(cs.M, cs.N, cs.K, A.ptr(), A.rs, A.cs, B.ptr(), B.rs, B.cs, C.data(), ldc,
             accumulate);
          check_close(cs.M, cs.N, cs.K, ldc, C, R, C0, 1e-6);
        }
      }
    }
  }
}

TEST_CASE("gemm kernels: the run-time choice follows the CPU", "[gemm][avx2]") {
  const std::string f32 = tpu::kernels::gemm_f32_kernel_name();
  const std::string bf16 = tpu::kernels::gemm_bf16_kernel_name();
  if (tpu::kernels::gemm_bf16_amx_available()) {
    CHECK(f32 == "avx512");
    CHECK(bf16.rfind("amx_bf16", 0) == 0);
  } else if (f32 == "avx512") {
    CHECK((bf16 == "avx512_bf16" || bf16 == "avx512_f32"));
  } else if (tpu::kernels::gemm_avx2_available()) {
    CHECK(f32 == "avx2");
    CHECK(bf16 == "avx2_f32");
  } else {
    CHECK(f32 == "generic");
    CHECK(bf16 == "generic");
  }
}

// Run by CTest with TPU_CPU_FEATURES=avx2 (tests/CMakeLists.txt), together with the GEMM, GEMV
// and matmul suites: an AVX-512 machine then dispatches as an AVX2-only CPU would.
TEST_CASE("cpu features: TPU_CPU_FEATURES=avx2 keeps only AVX2 and FMA", "[.features-env]") {
  const char* env = std::getenv("TPU_CPU_FEATURES");
  REQUIRE(env != nullptr);
  REQUIRE(std::string(env) == "avx2");
  const tpu::CpuFeatures& f = tpu::cpu_features();
  CHECK_FALSE(f.avx512f);
  CHECK_FALSE(f.avx512bw);
  CHECK_FALSE(f.avx512vl);
  CHECK_FALSE(f.avx512_bf16);
  CHECK_FALSE(f.amx_bf16);
  CHECK_FALSE(tpu::kernels::gemm_bf16_amx_available());
  const std::string f32 = tpu::kernels::gemm_f32_kernel_name();
  CHECK(f32 == (f.avx2 && f.fma ? "avx2" : "generic"));
  if (!f.avx2) WARN("this CPU lacks AVX2: TPU_CPU_FEATURES=avx2 leaves the portable kernels");
}

TEST_CASE("gemm kernels on 1 and 2 threads: block edges, ragged sizes, shared B blocks", "[gemm]") {
  // Sizes around the register tiles (14 x 32 AVX-512, 6 x 16 AVX2), the K block (256 f32
  // steps, 512 bf16) and the column block (4096): rows split over a team that packs each B
  // block together (several K and column blocks alternate between two buffers), with ragged
  // row shares, odd K for the bf16 pairs, and the same sizes on one thread.
  struct Sized { int64_t M, N, K; };
  const Sized cases[] = {{113, 4100, 521}, {257, 255, 513}, {29, 33, 1030}, {300, 47, 300}};
  const int saved = tpu::num_threads();
  auto fgen = f32_gen();
  auto bgen = bf16_gen();
  for (const Sized& cs : cases) {
    const int64_t ldc = cs.N + 2;
    std::vector<float> C0(static_cast<size_t>(cs.M * ldc));
    for (size_t i = 0; i < C0.size(); ++i) C0[i] = float(int(i % 9) - 4);
    const Operand<float> A = make_operand<float>(cs.M, cs.K, Layout::RowMajor, fgen);
    const Operand<float> B = make_operand<float>(cs.K, cs.N, Layout::RowMajor, fgen);
    const auto R = reference(cs.M, cs.N, cs.K, A, B, C0, ldc, true, f32_id);
    // bf16 against a double sum of the same bf16 values (f32 accumulation inside the kernel).
    const Operand<uint16_t> Ab = make_operand<uint16_t>(cs.M, cs.K, Layout::RowMajor, bgen);
    const Operand<uint16_t> Bb = make_operand<uint16_t>(cs.K, cs.N, Layout::RowMajor, bgen);
    const auto Rb = reference(cs.M, cs.N, cs.K, Ab, Bb, C0, ldc, false, bf16_bits_to_float);
    for (int threads : {1, 2}) {
      tpu::set_num_threads(threads);
      INFO("M=" << cs.M << " N=" << cs.N << " K=" << cs.K << " threads=" << threads);
      std::vector<float> C = C0;
      gemm_f32(cs.M, cs.N, cs.K, A.ptr(), A.rs, A.cs, B.ptr(), B.rs, B.cs, C.data(), ldc, true);
      check_close(cs.M, cs.N, cs.K, ldc, C, R, C0, 1e-6);
      C = C0;
      gemm_bf16(cs.M, cs.N, cs.K, Ab.ptr(), Ab.rs, Ab.cs, Bb.ptr(), Bb.rs, Bb.cs, C.data(), ldc, false);
      check_close(cs.M, cs.N, cs.K, ldc, C, Rb, C0, 1e-6);
      if (tpu::kernels::gemm_avx2_available() && cs.N < 1000) {
        C = C0;
        gemm_f32_avx2(cs.M, cs.N, cs.K, A.ptr(), A.rs, A.cs, B.ptr(), B.rs, B.cs, C.data(), ldc, true);
        check_close(cs.M, cs.N, cs.K, ldc, C, R, C0, 1e-6);
        C = C0;
        gemm_bf16_avx2(cs.M, cs.N, cs.K, Ab.ptr(), Ab.rs, Ab.cs, Bb.ptr(), Bb.rs, Bb.cs, C.data(), ldc, false);
        check_close(cs.M, cs.N, cs.K, ldc, C, Rb, C0, 1e-6);
      }
    }
  }
  tpu::set_num_threads(saved);
}

TEST_CASE("gemm_bf16 AMX tiles match a naive loop: ragged tiles, K blocks, layouts, accumulate",
          "[gemm][amx]") {
  if (!tpu::kernels::gemm_bf16_amx_available()) {
    WARN("AMX GEMM skipped: this CPU lacks amx_bf16, the OS refused the tile state, or TPU_CPU_AMX=0");
    const uint16_t a[1] = {}, b[1] = {};
    float c[1] = {};
    CHECK_FALSE(tpu::kernels::gemm_bf16_amx(1, 1, 1, a, 1, 1, b, 1, 1, c, 1, false));
    return;
  }
  auto gen = bf16_gen();
  std::mt19937 rng(5);
  // Rows past one 16-row tile, one 32-row pair and the 128-row unit; columns past a 16-column
  // tile and a 32-column panel; K short of one 32-step, odd, and past the 1024 K block (twice);
  // 64 x 64 x 512 takes the path that writes whole C tiles straight to C.
  const std::vector<GemmCase> cases = {{16, 16, 32},  {17, 33, 33}, {31, 47, 65},  {64, 64, 512},
                                   {130, 70, 600}, {300, 96, 97}, {33, 1, 40}, {45, 40, 2100}};
  const Layout layouts[] = {Layout::RowMajor, Layout::ColMajor, Layout::Strided};
  for (const GemmCase& cs : cases)
    for (Layout la : layouts)
      for (Layout lb : layouts)
        for (bool accumulate : {false, true}) {
          INFO("M=" << cs.M << " N=" << cs.N << " K=" << cs.K << " A " << layout_name(la) << " B "
                    << layout_name(lb) << " accumulate=" << accumulate);
          const Operand<uint16_t> A = make_operand<uint16_t>(cs.M, cs.K, la, gen);
          const Operand<uint16_t> B = make_operand<uint16_t>(cs.K, cs.N, lb, gen);
          const int64_t ldc = cs.N + 5;
          std::vector<float> C0(static_cast<size_t>(cs.M * ldc));
          for (auto& v : C0) v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
          std::vector<float> C = C0;
          REQUIRE(tpu::kernels::gemm_bf16_amx(cs.M, cs.N, cs.K, A.ptr(), A.rs, A.cs, B.ptr(), B.rs, B.cs, C.data(),
                                              ldc, accumulate));
          check_close(cs.M, cs.N, cs.K, ldc, C,
                      reference(cs.M, cs.N, cs.K, A, B, C0, ldc, accumulate, bf16_bits_to_float), C0, 1e-6);
        }
  // A read in place (K a multiple of 32, rows on cache lines and not 2 KiB-multiples apart):
  // whole 128-row units from A itself, the ragged last unit and a 2 KiB row stride copied.
  {
    struct InPlace {
      int64_t M, N, K, a_rs;
    };
    for (const InPlace& ip : {InPlace{260, 40, 96, 96}, InPlace{64, 33, 64, 96}, InPlace{96, 32, 1024, 1024},
                              InPlace{128, 48, 1088, 1088}}) {
      INFO("in place: M=" << ip.M << " N=" << ip.N << " K=" << ip.K << " a_rs=" << ip.a_rs);
      tpu::kernels::detail::ScratchBuffer abuf;  // 64-byte aligned
      uint16_t* a = abuf.get_as<uint16_t>(static_cast<size_t>(ip.M * ip.a_rs));
      std::vector<uint16_t> bv(static_cast<size_t>(ip.K * ip.N));
      for (int64_t i = 0; i < ip.M * ip.a_rs; ++i) a[i] = gen();
      for (auto& v : bv) v = gen();
      std::vector<float> C(static_cast<size_t>(ip.M * ip.N), 7.0f);
      REQUIRE(tpu::kernels::gemm_bf16_amx(ip.M, ip.N, ip.K, a, ip.a_rs, 1, bv.data(), ip.N, 1, C.data(), ip.N, false));
      for (int64_t i = 0; i < ip.M; ++i)
        for (int64_t j = 0; j < ip.N; ++j) {
          double ref = 0;
          for (int64_t k = 0; k < ip.K; ++k)
            ref += double(bf16_bits_to_float(a[i * ip.a_rs + k])) * double(bf16_bits_to_float(bv[k * ip.N + j]));
          const double got = C[static_cast<size_t>(i * ip.N + j)];
          if (std::abs(got - ref) > 1e-5 * (1.0 + std::abs(ref))) FAIL("C[" << i << ", " << j << "] = " << got << ", expected " << ref);
        }
    }
  }
  // One thread and two give the same sums (every C element is one thread's).
  const Operand<uint16_t> A = make_operand<uint16_t>(257, 96, Layout::RowMajor, gen);
  const Operand<uint16_t> B = make_operand<uint16_t>(96, 64, Layout::RowMajor, gen);
  std::vector<float> C1(257 * 64), C2(257 * 64);
  const int threads = tpu::num_threads();
  tpu::set_num_threads(1);
  tpu::kernels::gemm_bf16_amx(257, 64, 96, A.ptr(), A.rs, A.cs, B.ptr(), B.rs, B.cs, C1.data(), 64, false);
  tpu::set_num_threads(2);
  tpu::kernels::gemm_bf16_amx(257, 64, 96, A.ptr(), A.rs, A.cs, B.ptr(), B.rs, B.cs, C2.data(), 64, false);
  tpu::set_num_threads(threads);
  CHECK(C1 == C2);
}

// Few rows times a weight read in place (gemm_bf16_amx_wt): W [N, K] rows ldw apart (the gaps
// filled with values a kernel reading past K would pick up), B = W^T. Rows of A around the 16-row
// tiles and the four tiles of one pass (1, 15, 16, 17, 33, 40, 64, 65, 80), N not a multiple of
// 16, K short of and past multiples of 32 (1, 31, 40, 100), A strided along K, accumulate, and
// one product large enough to split N over two threads.
TEST_CASE("gemm_bf16 AMX with the weight in place matches a naive loop", "[gemm][amx]") {
  if (!tpu::kernels::gemm_bf16_amx_available()) {
    WARN("AMX weight-in-place GEMM skipped: this CPU lacks amx_bf16, the OS refused the tile state, or TPU_CPU_AMX=0");
    const uint16_t a[1] = {}, b[1] = {};
    float c[1] = {};
    CHECK_FALSE(tpu::kernels::gemm_bf16_amx_wt(1, 1, 1, a, 1, 1, b, 1, 1, c, 1, false));
    return;
  }
  auto gen = bf16_gen();
  std::mt19937 rng(9);
  struct Case {
    int64_t M, N, K, a_cs;
    bool accumulate;
  };
  const std::vector<Case> cases = {{1, 17, 40, 1, false},  {15, 50, 100, 1, true}, {16, 16, 32, 1, false},
                                   {17, 33, 64, 2, false}, {33, 40, 100, 1, true}, {40, 1, 31, 1, false},
                                   {64, 48, 1, 1, false},  {65, 20, 96, 3, true},  {80, 35, 130, 1, false},
                                   {2, 7, 300, 1, false},  {33, 301, 416, 1, false}};
  const int threads = tpu::num_threads();
  for (int nt : {1, 2}) {
    tpu::set_num_threads(nt);
    for (const Case& cs : cases) {
      INFO("threads=" << nt << " M=" << cs.M << " N=" << cs.N << " K=" << cs.K << " a_cs=" << cs.a_cs
                      << " accumulate=" << cs.accumulate);
      const int64_t ldw = cs.K + 3, a_rs = cs.K * cs.a_cs + 5, ldc = cs.N + 4;
      std::vector<uint16_t> w(static_cast<size_t>(cs.N * ldw)), a(static_cast<size_t>(cs.M * a_rs));
      for (auto& v : w) v = gen();
      for (auto& v : a) v = gen();
      std::vector<float> C0(static_cast<size_t>(cs.M * ldc));
      for (auto& v : C0) v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
      std::vector<float> C = C0;
      REQUIRE(tpu::kernels::gemm_bf16_amx_wt(cs.M, cs.N, cs.K, a.data(), a_rs, cs.a_cs, w.data(), 1, ldw, C.data(),
                                             ldc, cs.accumulate));
      std::vector<double> R(C.size());
      for (int64_t i = 0; i < cs.M; ++i)
        for (int64_t j = 0; j < cs.N; ++j) {
          double r = cs.accumulate ? C0[static_cast<size_t>(i * ldc + j)] : 0.0;
          for (int64_t k = 0; k < cs.K; ++k)
            r += double(bf16_bits_to_float(a[static_cast<size_t>(i * a_rs + k * cs.a_cs)])) *
                 double(bf16_bits_to_float(w[static_cast<size_t>(j * ldw + k)]));
          R[static_cast<size_t>(i * ldc + j)] = r;
        }
      check_close(cs.M, cs.N, cs.K, ldc, C, R, C0, 1e-6);
    }
  }
  tpu::set_num_threads(threads);
  // B not W^T (rows of W not contiguous along K): not this kernel's.
  const uint16_t a[4] = {}, b[4] = {};
  float c[4] = {};
  CHECK_FALSE(tpu::kernels::gemm_bf16_amx_wt(2, 2, 2, a, 2, 1, b, 2, 1, c, 2, false));
}
