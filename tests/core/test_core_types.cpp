// Core types: dtype promotion, 16-bit float conversion, devices, shapes, the host
// allocator, the thread pool and printing.
#include <atomic>
#include <cmath>
#include <limits>
#include <random>

#include "testing.h"
#include "tpucore/core/allocator.h"
#include "tpucore/core/log.h"
#include "tpucore/core/parallel.h"

using namespace tpu;
using namespace tpu::testing;

TEST_CASE("dtype: promotion follows PyTorch's table", "[core]") {
  using D = DType;
  CHECK(promote_types(D::i32, D::f32) == D::f32);
  CHECK(promote_types(D::u8, D::i8) == D::i32);  // PyTorch gives i16; we have no i16
  CHECK(promote_types(D::bf16, D::f16) == D::f32);
  CHECK(promote_types(D::boolean, D::u8) == D::u8);
  CHECK(promote_types(D::boolean, D::i8) == D::i8);
  CHECK(promote_types(D::i32, D::bf16) == D::bf16);
  CHECK(promote_types(D::f16, D::u8) == D::f16);
  for (int a = 0; a < kNumDTypes; ++a)
    for (int b = 0; b < kNumDTypes; ++b) {
      if (a != b && (is_float8(D(a)) || is_float8(D(b)))) continue;  // an error (test_float8.cpp)
      CHECK(promote_types(D(a), D(b)) == promote_types(D(b), D(a)));
    }
}

TEST_CASE("dtype: result_type ranks dim tensors, 0-d tensors and wrapped scalars", "[core]") {
  auto rt = [](std::initializer_list<std::tuple<DType, bool, bool>> xs) {
    ResultTypeState s;
    for (auto [t, zd, w] : xs) s.update(t, zd, w);
    return s.result();
  };
  // i32 tensor + float scalar -> default float
  CHECK(rt({{DType::i32, false, false}, {DType::f32, true, true}}) == DType::f32);
  // bf16 tensor + float scalar stays bf16
  CHECK(rt({{DType::bf16, false, false}, {DType::f32, true, true}}) == DType::bf16);
  // u8 tensor + int scalar stays u8
  CHECK(rt({{DType::u8, false, false}, {DType::i32, true, true}}) == DType::u8);
  // bool tensor + int scalar -> i32
  CHECK(rt({{DType::boolean, false, false}, {DType::i32, true, true}}) == DType::i32);
  // i32 dim tensor + f16 0-d tensor -> f16 (higher category, keeps its own type)
  CHECK(rt({{DType::i32, false, false}, {DType::f16, true, false}}) == DType::f16);
  // f16 dim tensor + f32 0-d tensor -> f16 (same category: dim tensor wins)
  CHECK(rt({{DType::f16, false, false}, {DType::f32, true, false}}) == DType::f16);
  // two 0-d tensors promote normally
  CHECK(rt({{DType::f16, true, false}, {DType::bf16, true, false}}) == DType::f32);
}

TEST_CASE("dtype: names parse and print", "[core]") {
  for (int a = 0; a < kNumDTypes; ++a) CHECK(parse_dtype(dtype_name(DType(a))) == DType(a));
  CHECK(parse_dtype("float32") == DType::f32);
  CHECK_THROWS_AS(parse_dtype("float64"), Error);
  CHECK_THROWS_WITH(parse_dtype("complex"), Catch::Contains("complex"));
}

// Independent nearest-even check: the result r must be at least as close to x as both
// neighbours, and even on a tie.
template <class Decode>
static void check_rne(double x, uint16_t r, Decode decode) {
  const double vr = decode(r);
  if (std::isinf(vr)) return;  // overflow checked separately
  for (int d : {-1, 1}) {
    uint16_t n = static_cast<uint16_t>(r + d);
    if (((n ^ r) & 0x8000u) != 0) continue;  // crossed the sign
    const double vn = decode(n);
    if (std::isnan(vn)) continue;
    const double er = std::fabs(vr - x), en = std::fabs(vn - x);
    INFO("x=" << x << " r=" << r << " n=" << n);
    CHECK(er <= en);
    if (er == en) CHECK((r & 1u) == 0);
  }
}

TEST_CASE("half: bf16 and f16 round to nearest even, keep NaN and Inf", "[core]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    float f = bits_f32(u);
    if (std::isnan(f)) continue;
    check_rne(f, bf16::from_f32(f), [](uint16_t b) { return decode_bf16(b); });
    // f16: sample the representable range and beyond
    float h = std::ldexp(static_cast<float>(u % 100000) / 100000.0f, static_cast<int>(u % 40) - 28);
    if (u & 1) h = -h;
    uint16_t r = f16::from_f32(h);
    if (std::fabs(h) < 65520.0f) {
      CHECK(!std::isinf(decode_f16(r)));
      check_rne(h, r, [](uint16_t b) { return decode_f16(b); });
    } else {
      CHECK(std::isinf(decode_f16(r)));
    }
    CHECK(f16::from_bits(r).to_f32() == static_cast<float>(decode_f16(r)));
  }
  // Ties: 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125 -> even (1.0).
  CHECK(bf16(1.00390625f).to_f32() == 1.0f);
  CHECK(bf16(1.01171875f).to_f32() == 1.015625f);
  CHECK(std::isnan(bf16(NAN).to_f32()));
  CHECK(std::isnan(f16(NAN).to_f32()));
  CHECK(bf16(INFINITY).to_f32() == INFINITY);
  CHECK(f16(-INFINITY).to_f32() == -INFINITY);
  CHECK(f16(65504.0f).to_f32() == 65504.0f);
  CHECK(f16(1e-8f).to_f32() == 0.0f);
  CHECK(f16(5.9604645e-8f).to_f32() == 5.9604644775390625e-8f);  // smallest subnormal
  // Every f16 value converts to f32 and back exactly.
  for (uint32_t b = 0; b < 65536; ++b) {
    f16 h = f16::from_bits(static_cast<uint16_t>(b));
    float f = h.to_f32();
    if (std::isnan(f)) continue;
    CHECK(f16(f).bits == h.bits);
  }
}

TEST_CASE("device: strings parse, bad ones are errors", "[core]") {
  CHECK(Device("cpu").type == DeviceType::cpu);
  CHECK(Device("sim").index == 0);
  CHECK(Device("sim:3").index == 3);
  CHECK(Device("tpu:1").str() == "tpu:1");
  for (const char* bad : {"gpu", "sim:", "sim:x", "sim:-1", "cpu:1", "", "sim:1:2", "SIM"}) {
    INFO(bad);
    CHECK_THROWS_AS(Device(bad), Error);
  }
  CHECK_THROWS_WITH(Device("cuda:0"), Catch::Contains("cuda:0"));
  CHECK_THROWS_WITH(zeros({2}, TensorOptions(Device("tpu:0"))), Catch::Contains("TPU_DRIVER_PATH"));
}

TEST_CASE("shape: numel, strides, broadcasting, dim wrapping", "[core]") {
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{2, 0, 3}.numel() == 0);
  CHECK(contiguous_strides(Shape{2, 3, 4}) == Shape{12, 4, 1});
  CHECK(broadcast_shapes(Shape{3, 1}, Shape{4}, "t") == Shape{3, 4});
  CHECK(broadcast_shapes(Shape{}, Shape{2, 2}, "t") == Shape{2, 2});
  CHECK_THROWS_WITH(broadcast_shapes(Shape{3}, Shape{4}, "myop"), Catch::Contains("myop") && Catch::Contains("[3]"));
  CHECK(wrap_dim(-1, 3, "t") == 2);
  CHECK_THROWS_AS(wrap_dim(3, 3, "t"), Error);
  CHECK_THROWS_AS(Shape(std::vector<int64_t>(9, 1)), Error);
}

TEST_CASE("allocator: freed buffers are reused, stats add up, 64-byte aligned", "[core]") {
  host_reset_peak();
  const auto before = host_allocator_stats();
  {
    Tensor a = empty({1000, 1000});
    CHECK(reinterpret_cast<uintptr_t>(a.raw_data()) % 64 == 0);
    auto mid = host_allocator_stats();
    CHECK(mid.bytes_in_use >= before.bytes_in_use + 4000000);
    CHECK(mid.peak_in_use >= mid.bytes_in_use);
  }
  auto freed = host_allocator_stats();
  CHECK(freed.bytes_cached >= 4000000);
  const uint64_t hits = freed.cache_hits;
  { Tensor b = empty({1000, 1000}); }
  CHECK(host_allocator_stats().cache_hits == hits + 1);
  host_empty_cache();
  CHECK(host_allocator_stats().bytes_cached == 0);
}

TEST_CASE("parallel_for: covers the range exactly once, inline for small ranges", "[core]") {
  for (int64_t n : {0, 1, 7, 1000, 100001}) {
    std::vector<std::atomic<int>> hit(static_cast<size_t>(n));
    parallel_for(0, n, 100, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hit[static_cast<size_t>(i)]++;
    });
    for (auto& h : hit) CHECK(h.load() == 1);
  }
  std::atomic<int> calls{0};
  parallel_for(0, 10, 100, [&](int64_t b, int64_t e) {
    calls++;
    CHECK(b == 0);
    CHECK(e == 10);
  });
  CHECK(calls == 1);
}

TEST_CASE("printing: PyTorch-like layout, summarized when large", "[core]") {
  CHECK(fmt::format("{}", arange(6).reshape({2, 3})) == "tensor([[0, 1, 2],\n        [3, 4, 5]])");
  CHECK(full({2}, 1.5).str() == "tensor([1.5000, 1.5000])");
  CHECK(full({1}, 2.0, DType::bf16).str() == "tensor([2.], dtype=bf16)");
  CHECK(full({}, true).str() == "tensor(True)");
  CHECK(zeros({0}).str() == "tensor([])");
  std::string big = zeros({100, 100}).str();
  CHECK(big.find("...") != std::string::npos);
  CHECK(big.size() < 1000);
}

TEST_CASE("log: level names are checked", "[core]") {
  set_log_level("error");
  CHECK_THROWS_WITH(set_log_level("loud"), Catch::Contains("loud"));
  set_log_level("warn");
}
