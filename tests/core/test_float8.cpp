// The float8 dtypes f8e4m3 (OCP E4M3, PyTorch's float8_e4m3fn) and f8e5m2: conversions against
// an independent model written here (every code decoded by its closed form, the nearest code
// picked by search with ties to the even mantissa, overflow as PyTorch's float8 casts),
// exhaustively over the 2^16 bf16 and f16 bit patterns and over f32 inputs at every rounding
// boundary; fp8 -> f32 over all 256 codes; promotion; the ops that take float8 and those that
// refuse it; item(), printing, safetensors and the sim device.
#include <cmath>
#include <cstring>
#include <limits>

#include "codegen_testing.h"
#include "testing.h"
#include "tpucore/compile.h"
#include "tpucore/safetensors.h"

namespace tpu::testing {
namespace {

// ---- the independent model ----
struct Format {
  DType dtype;
  double (*decode)(uint8_t);
  // The first value past the largest finite one in the same format with an unbounded exponent
  // (480 = 1.111b x 2^8 for E4M3, 65536 = 1.00b x 2^16 for E5M2), and whether its mantissa is
  // even: rounding onto it is an overflow.
  double phantom;
  bool phantom_even;
  uint8_t overflow_code;  // what an overflow gives: NaN 0x7f (E4M3) or inf 0x7c (E5M2)
  uint8_t nan_code;       // what a NaN gives (sign kept)
  double max_finite;
};
const Format kE4M3{DType::f8e4m3, &decode_f8e4m3, 480.0, false, 0x7f, 0x7f, 448.0};
const Format kE5M2{DType::f8e5m2, &decode_f8e5m2, 65536.0, true, 0x7c, 0x7f, 57344.0};

// The code of x: round to nearest among the finite codes of x's sign and the phantom value,
// ties to the even mantissa (the code's lowest bit); landing on the phantom is an overflow.
// With `saturate`, magnitudes beyond the largest finite value (infinities included) give it.
uint8_t encode_ref(const Format& f, double x, bool saturate = false) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<uint8_t>(f.nan_code | sign);
  if (saturate && std::fabs(x) > f.max_finite) x = std::copysign(f.max_finite, x);
  // At or past the phantom, the nearest value of the unbounded format is the phantom or a larger
  // one: an overflow (this also keeps the distances below exact in double).
  if (std::fabs(x) >= f.phantom) return static_cast<uint8_t>(f.overflow_code | sign);
  int best = -1;
  double best_d = INFINITY;
  bool best_even = false;
  for (int c = 0; c < 128; ++c) {
    const double v = f.decode(static_cast<uint8_t>(c));
    if (std::isnan(v) || std::isinf(v)) continue;
    const double d = std::fabs(std::fabs(x) - v);
    const bool even = (c & 1) == 0;
    if (d < best_d || (d == best_d && even && !best_even)) {
      best = c;
      best_d = d;
      best_even = even;
    }
  }
  const double dp = std::fabs(std::fabs(x) - f.phantom);
  if (dp < best_d || (dp == best_d && f.phantom_even && !best_even)) return static_cast<uint8_t>(f.overflow_code | sign);
  return static_cast<uint8_t>(best | sign);
}

// Every finite non-negative value of the format, ascending.
std::vector<double> finite_values(const Format& f) {
  std::vector<double> v;
  for (int c = 0; c < 128; ++c) {
    const double x = f.decode(static_cast<uint8_t>(c));
    if (std::isfinite(x)) v.push_back(x);
  }
  return v;  // codes 0..127 decode in ascending order
}

// f32 inputs at the rounding boundaries of the format: each value, each midpoint between
// neighbours (and the f32 values next to it), max, max + half an ulp, the phantom, subnormals
// and their halves, zeros, infinities, NaN, both signs.
std::vector<float> boundary_inputs(const Format& f) {
  std::vector<float> in;
  auto add = [&](double d) {
    const float x = static_cast<float>(d);
    for (float s : {x, -x}) {
      in.push_back(s);
      in.push_back(std::nextafter(s, INFINITY));
      in.push_back(std::nextafter(s, -INFINITY));
    }
  };
  const std::vector<double> v = finite_values(f);
  for (size_t i = 0; i < v.size(); ++i) {
    add(v[i]);
    if (i + 1 < v.size()) add((v[i] + v[i + 1]) / 2);
  }
  add((f.max_finite + f.phantom) / 2);  // max + half an ulp: 464 / 61440
  add(f.phantom);
  add(f.phantom * 2);
  add(v[1] / 2);   // half the smallest subnormal: a tie with zero
  add(v[1] / 4);
  add(1e-30);
  add(std::numeric_limits<float>::denorm_min());
  add(std::numeric_limits<float>::max());
  add(INFINITY);
  in.push_back(NAN);
  in.push_back(-NAN);
  return in;
}

Tensor codes_tensor(DType dt, const std::vector<uint8_t>& codes) {
  return from_buffer(codes.data(), dt, Shape{static_cast<int64_t>(codes.size())}, {});
}
std::vector<uint8_t> codes_of(const Tensor& t) {
  Tensor c = contiguous(t.to(Device()));
  std::vector<uint8_t> r(static_cast<size_t>(c.numel()));
  if (!r.empty()) std::memcpy(r.data(), c.raw_data(), r.size());
  return r;
}
uint8_t scalar_encode(DType dt, float x) { return dt == DType::f8e4m3 ? f8e4m3::from_f32(x) : f8e5m2::from_f32(x); }

// Compares the cast of `src` (any source dtype) to fp8 with encode_ref of its values; reports
// the first few mismatches.
void check_cast_to_fp8(const Format& f, const Tensor& src, const std::vector<double>& values) {
  const std::vector<uint8_t> got = codes_of(src.to(f.dtype));
  REQUIRE(got.size() == values.size());
  int bad = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const uint8_t want = encode_ref(f, values[i]);
    if (got[i] != want && ++bad <= 5)
      FAIL_CHECK(fmt::format("{} from {}: x = {:a} gave 0x{:02x}, expected 0x{:02x}", dtype_name(f.dtype),
                             dtype_name(src.dtype()), values[i], got[i], want));
  }
  CHECK(bad == 0);
}

TEST_CASE("float8: every code decodes to its closed form", "[float8]") {
  for (const Format* f : {&kE4M3, &kE5M2}) {
    std::vector<uint8_t> codes(256);
    for (int c = 0; c < 256; ++c) codes[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
    const std::vector<float> got = codes_tensor(f->dtype, codes).to(DType::f32).to_vector<float>();
    for (int c = 0; c < 256; ++c) {
      const double want = f->decode(static_cast<uint8_t>(c));
      const float g = got[static_cast<size_t>(c)];
      const float s = f->dtype == DType::f8e4m3 ? f8e4m3::from_bits(static_cast<uint8_t>(c)).to_f32()
                                                : f8e5m2::from_bits(static_cast<uint8_t>(c)).to_f32();
      INFO(dtype_name(f->dtype) << " code " << c);
      if (std::isnan(want)) {
        CHECK(std::isnan(g));
        CHECK(std::isnan(s));
      } else {
        CHECK(static_cast<double>(g) == want);
        CHECK(std::signbit(g) == std::signbit(want));  // -0 stays -0
        CHECK(static_cast<double>(s) == want);
      }
    }
    // To bf16 and f16 the values are exact too (both hold every fp8 value).
    const Tensor all = codes_tensor(f->dtype, codes);
    const std::vector<float> via_bf16 = all.to(DType::bf16).to(DType::f32).to_vector<float>();
    const std::vector<float> via_f16 = all.to(DType::f16).to(DType::f32).to_vector<float>();
    for (int c = 0; c < 256; ++c) {
      const double want = f->decode(static_cast<uint8_t>(c));
      if (std::isnan(want)) continue;
      CHECK(static_cast<double>(via_bf16[static_cast<size_t>(c)]) == want);
      CHECK(static_cast<double>(via_f16[static_cast<size_t>(c)]) == want);
    }
  }
  // The special codes named by the formats.
  CHECK(decode_f8e4m3(0x7e) == 448.0);
  CHECK(std::isnan(decode_f8e4m3(0x7f)));
  CHECK(std::isnan(decode_f8e4m3(0xff)));
  CHECK(decode_f8e4m3(0x78) == 256.0);  // S.1111.000 is finite in E4M3
  CHECK(decode_f8e5m2(0x7b) == 57344.0);
  CHECK(decode_f8e5m2(0x7c) == INFINITY);
  CHECK(decode_f8e5m2(0xfc) == -INFINITY);
}

TEST_CASE("float8: all 2^16 bf16 and f16 inputs round as the reference", "[float8]") {
  std::vector<uint16_t> bits(65536);
  for (uint32_t i = 0; i < 65536; ++i) bits[i] = static_cast<uint16_t>(i);
  std::vector<double> bf(65536), hf(65536);
  for (size_t i = 0; i < bits.size(); ++i) {
    bf[i] = decode_bf16(bits[i]);
    hf[i] = decode_f16(bits[i]);
  }
  const Tensor tb = from_buffer(bits.data(), DType::bf16, Shape{65536}, {});
  const Tensor th = from_buffer(bits.data(), DType::f16, Shape{65536}, {});
  for (const Format* f : {&kE4M3, &kE5M2}) {
    check_cast_to_fp8(*f, tb, bf);
    check_cast_to_fp8(*f, th, hf);
  }
}

TEST_CASE("float8: f32 inputs at the rounding boundaries round as the reference", "[float8]") {
  for (const Format* f : {&kE4M3, &kE5M2}) {
    const std::vector<float> in = boundary_inputs(*f);
    std::vector<double> vals(in.begin(), in.end());
    const Tensor t = from_vector(in);
    check_cast_to_fp8(*f, t, vals);
    // A strided source goes through the same conversion.
    check_cast_to_fp8(*f, t.reshape({static_cast<int64_t>(in.size()) / 2, 2}).transpose(0, 1).contiguous().transpose(0, 1),
                      vals);
    // The scalar conversion agrees.
    int bad = 0;
    for (float x : in) bad += scalar_encode(f->dtype, x) != encode_ref(*f, x);
    CHECK(bad == 0);
  }
  // The overflow rules, spelled out.
  CHECK(f8e4m3::from_f32(464.0f) == 0x7e);                             // tie: even 448
  CHECK(f8e4m3::from_f32(std::nextafter(464.0f, 1e9f)) == 0x7f);        // past it: NaN
  CHECK(f8e4m3::from_f32(-INFINITY) == 0xff);
  CHECK(f8e5m2::from_f32(61440.0f) == 0x7c);                            // tie: even 2^16 = inf
  CHECK(f8e5m2::from_f32(std::nextafter(61440.0f, 0.0f)) == 0x7b);      // 57344
  CHECK(f8e5m2::from_f32(-1e30f) == 0xfc);
  CHECK(f8e4m3::from_f32(std::ldexp(1.0f, -10)) == 0x00);               // half the smallest subnormal: even 0
  CHECK(f8e4m3::from_f32(-std::ldexp(1.0f, -10)) == 0x80);              // -0
  CHECK(f8e4m3::from_f32(3 * std::ldexp(1.0f, -10)) == 0x02);           // 1.5 steps: even 2
}

TEST_CASE("float8: saturating conversion clamps to the largest finite value", "[float8]") {
  for (const Format* f : {&kE4M3, &kE5M2}) {
    int bad = 0;
    for (float x : boundary_inputs(*f)) {
      const uint8_t got = f->dtype == DType::f8e4m3 ? f8e4m3::from_f32_saturating(x) : f8e5m2::from_f32_saturating(x);
      const uint8_t want = encode_ref(*f, x, /*saturate=*/true);
      if (got != want && ++bad <= 5) FAIL_CHECK(fmt::format("{} saturating {:a}: 0x{:02x} vs 0x{:02x}", dtype_name(f->dtype), x, got, want));
    }
    CHECK(bad == 0);
  }
  CHECK(f8e4m3::from_f32_saturating(1e6f) == 0x7e);
  CHECK(f8e4m3::from_f32_saturating(-INFINITY) == 0xfe);
  CHECK(f8e5m2::from_f32_saturating(INFINITY) == 0x7b);
  CHECK(f8e5m2::from_f32_saturating(NAN) == 0x7f);
}

TEST_CASE("float8: from integers and to integers and bool", "[float8]") {
  const Tensor i = from_vector(std::vector<int32_t>{0, 1, -3, 17, 300, 500, -70000});
  CHECK(codes_of(i.to(DType::f8e4m3)) ==
        std::vector<uint8_t>{0x00, 0x38, 0xc4, 0x58 /*16: 17 ties to even 16*/, 0x79 /*288: 300 rounds to 288*/, 0x7f, 0xff});
  const Tensor x = from_vector(std::vector<float>{-2.5f, 0.0f, 448.0f, -448.0f}).to(DType::f8e4m3);
  CHECK(x.to(DType::i32).to_vector<int32_t>() == std::vector<int32_t>{-2, 0, 448, -448});
  CHECK(x.to(DType::boolean).to_vector<bool>() == std::vector<bool>{true, false, true, true});
  const Tensor n = codes_tensor(DType::f8e4m3, {0x7f});
  CHECK(n.to(DType::i32).item().to_int() == 0);  // NaN -> 0, as every float -> int cast here
}

TEST_CASE("float8: promotion refuses every mixed pair, as torch.promote_types", "[float8]") {
  CHECK(promote_types(DType::f8e4m3, DType::f8e4m3) == DType::f8e4m3);
  CHECK(promote_types(DType::f8e5m2, DType::f8e5m2) == DType::f8e5m2);
  for (int a = 0; a < kNumDTypes; ++a)
    for (DType f : {DType::f8e4m3, DType::f8e5m2}) {
      if (DType(a) == f) continue;
      CHECK_THROWS_WITH(promote_types(DType(a), f), Catch::Contains("float8"));
      CHECK_THROWS_AS(promote_types(f, DType(a)), Error);
    }
  CHECK(is_floating(DType::f8e4m3));
  CHECK(parse_dtype("float8_e4m3fn") == DType::f8e4m3);
  CHECK(parse_dtype("float8_e5m2") == DType::f8e5m2);
  CHECK(parse_dtype("f8e5m2") == DType::f8e5m2);
  CHECK(dtype_size(DType::f8e4m3) == 1);
}

TEST_CASE("float8: compute ops refuse float8 with the op and dtype named", "[float8]") {
  const Tensor a = from_vector(std::vector<float>{1, 2, 3}).to(DType::f8e4m3);
  const Tensor b = from_vector(std::vector<float>{1, 2, 3}).to(DType::f8e5m2);
  CHECK_THROWS_WITH(add(a, a), Catch::Contains("add") && Catch::Contains("f8e4m3"));
  CHECK_THROWS_WITH(add(a, from_vector(std::vector<float>{1, 2, 3})), Catch::Contains("float8"));
  CHECK_THROWS_AS(mul(a, b), Error);
  CHECK_THROWS_WITH(sum(b), Catch::Contains("f8e5m2"));
  CHECK_THROWS_AS(matmul(a.reshape({1, 3}), a.reshape({3, 1})), Error);
  CHECK_THROWS_AS(randn({2}, TensorOptions(DType::f8e4m3)), Error);
  // What float8 tensors do support: views, copies, filling, reading.
  const Tensor v = a.reshape({3, 1}).transpose(0, 1);
  CHECK(v.contiguous().to(DType::f32).to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(clone(a).to(DType::f32).to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(zeros({2}, TensorOptions(DType::f8e5m2)).to(DType::f32).to_vector<float>() == std::vector<float>{0, 0});
  CHECK(full({2}, 300.0, TensorOptions(DType::f8e4m3)).to(DType::f32).to_vector<float>() == std::vector<float>{288, 288});
  Tensor dst = zeros({3}, TensorOptions(DType::f8e4m3));
  dst.copy_(from_vector(std::vector<float>{0.1f, 1000.0f, -0.0f}));
  CHECK(codes_of(dst) == std::vector<uint8_t>{encode_ref(kE4M3, 0.1f), 0x7f, 0x80});
}

TEST_CASE("float8: item, printing and to_vector", "[float8]") {
  const Tensor a = from_vector(std::vector<float>{1.0f, -0.3f, 240.0f}).to(DType::f8e4m3);
  CHECK(a.select(0, 1).item().to_double() == decode_f8e4m3(encode_ref(kE4M3, -0.3f)));
  CHECK(a.select(0, 2).item().to_double() == 240.0);
  const std::string s = a.str();
  CHECK_THAT(s, Catch::Contains("dtype=f8e4m3"));
  CHECK_THAT(s, Catch::Contains("240"));
  CHECK_THAT(from_vector(std::vector<float>{1e9f}).to(DType::f8e5m2).str(), Catch::Contains("inf"));
  const std::vector<f8e5m2> v = from_vector(std::vector<float>{0.5f, 3.0f}).to(DType::f8e5m2).to_vector<f8e5m2>();
  REQUIRE(v.size() == 2);
  CHECK(v[0].bits == 0x38);
  CHECK(v[1].bits == 0x42);
}

TEST_CASE("float8: safetensors names F8_E4M3 and F8_E5M2 round-trip the bytes", "[float8]") {
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
  TensorList tl{{"w4", codes_tensor(DType::f8e4m3, codes)}, {"w5", codes_tensor(DType::f8e5m2, codes).reshape({16, 16})}};
  const std::vector<uint8_t> bytes = serialize_safetensors(tl);
  const std::string text(bytes.begin(), bytes.end());
  CHECK_THAT(text, Catch::Contains("\"F8_E4M3\""));
  CHECK_THAT(text, Catch::Contains("\"F8_E5M2\""));
  const SafetensorsContents back = parse_safetensors(bytes);
  CHECK(back.tensors.at("w4").dtype() == DType::f8e4m3);
  CHECK(back.tensors.at("w5").dtype() == DType::f8e5m2);
  CHECK(back.tensors.at("w5").shape() == Shape{16, 16});
  CHECK(codes_of(back.tensors.at("w4")) == codes);
  CHECK(codes_of(back.tensors.at("w5")) == codes);
  CHECK(safetensors_dtype_name(DType::f8e4m3) == "F8_E4M3");
}

TEST_CASE("float8: casts on the sim device match the cpu's bits", "[float8][sim]") {
  TinySim sim;
  const std::vector<float> in = boundary_inputs(kE4M3);
  const Tensor x = from_vector(in);
  const Tensor xd = x.to(sim.dev());
  for (const Format* f : {&kE4M3, &kE5M2}) {
    const Tensor q = xd.to(f->dtype);
    CHECK(q.device() == sim.dev());
    std::vector<double> vals(in.begin(), in.end());
    std::vector<uint8_t> want(in.size());
    for (size_t i = 0; i < in.size(); ++i) want[i] = encode_ref(*f, in[i]);
    CHECK(codes_of(q) == want);
    // Back to f32 and bf16 on the device: exact.
    const std::vector<float> back = q.to(DType::f32).to_vector<float>();
    const std::vector<float> back16 = q.to(DType::bf16).to(DType::f32).to_vector<float>();
    int bad = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const double d = f->decode(want[i]);
      if (std::isnan(d)) bad += !std::isnan(back[i]) + !std::isnan(back16[i]);
      else bad += (back[i] != d) + (back16[i] != d);
    }
    CHECK(bad == 0);
    CHECK_THROWS_WITH(add(q, q), Catch::Contains(std::string(dtype_name(f->dtype))));
  }
}

TEST_CASE("float8: casts inside compile", "[float8][jit]") {
  auto f4 = compile([](const Tensor& x) { return x.to(DType::f8e4m3).to(DType::f32); });
  auto f5 = compile([](const Tensor& x) { return x.to(DType::f8e5m2); });
  const std::vector<float> in = boundary_inputs(kE5M2);
  const Tensor x = from_vector(in);
  const std::vector<float> r4 = f4(x).to_vector<float>();
  const std::vector<uint8_t> r5 = codes_of(f5(x));
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const double d = decode_f8e4m3(encode_ref(kE4M3, in[i]));
    bad += std::isnan(d) ? !std::isnan(r4[i]) : r4[i] != d;
    bad += r5[i] != encode_ref(kE5M2, in[i]);
  }
  CHECK(bad == 0);
}

}  // namespace
}  // namespace tpu::testing
