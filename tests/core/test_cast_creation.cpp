// to_dtype (every dtype pair, round to nearest even for bf16/f16 against an independent
// rounding routine, NaN/Inf kept), the creation ops full/arange/linspace/eye (OpInfo entries
// whose only input is a small params tensor: it names the case and dtype and, moved to the
// device under test by the runner, tells `run` where to create), and the random op by its
// moments, ranges and seeding.
#include <cmath>
#include <set>

#include "index_test_util.h"

namespace tpu::testing {
namespace {

using L = Layout;

// ---- an independent model of each dtype's conversion ----
// Rounds v to a binary float with p significant bits, minimum normal exponent emin and
// largest finite value maxv, to nearest with ties to even (nearbyint uses the default mode).
double round_binary(double v, int p, int emin, double maxv) {
  if (std::isnan(v) || std::isinf(v) || v == 0) return v;
  int e;
  std::frexp(std::fabs(v), &e);  // |v| = m * 2^e with m in [0.5, 1)
  const int lead = std::max(e - 1, emin);
  const double q = std::ldexp(1.0, lead - (p - 1));
  const double r = std::nearbyint(v / q) * q;
  return std::fabs(r) > maxv ? std::copysign(INFINITY, v) : r;
}
double to_bf16_ref(double v) { return round_binary(v, 8, -126, std::ldexp(255.0, 120)); }
double to_f16_ref(double v) { return round_binary(v, 11, -14, 65504.0); }
double to_f32_ref(double v) { return round_binary(v, 24, -126, std::ldexp(16777215.0, 104)); }

// The library's documented conversions: floats to integers truncate toward zero, saturate
// at the type's range and send NaN to 0; integers to narrower integers wrap; anything
// nonzero (NaN included) is true.
double convert_ref(double v, DType from, DType to) {
  switch (to) {
    case DType::f32: return to_f32_ref(v);
    case DType::bf16: return to_bf16_ref(is_floating(from) ? v : to_f32_ref(v));
    case DType::f16: return to_f16_ref(is_floating(from) ? v : to_f32_ref(v));
    case DType::boolean: return v != 0 || std::isnan(v) ? 1 : 0;
    case DType::i64: {
      if (!is_floating(from)) return v;  // every other integer fits
      if (std::isnan(v)) return 0;
      const double t = std::trunc(v), lim = 9223372036854775808.0;  // 2^63; 2^63 - 1 reads back as it
      return t < -lim ? -lim : (t >= lim ? lim : t);
    }
    default: break;
  }
  const double lo = to == DType::i32 ? -2147483648.0 : to == DType::i8 ? -128.0 : 0.0;
  const double hi = to == DType::i32 ? 2147483647.0 : to == DType::i8 ? 127.0 : 255.0;
  if (is_floating(from)) {
    if (std::isnan(v)) return 0;
    const double t = std::trunc(v);
    return t < lo ? lo : (t > hi ? hi : t);
  }
  const double m = hi - lo + 1;  // wrap modulo 2^bits
  double w = std::fmod(v - lo, m);
  if (w < 0) w += m;
  return w + lo;
}

// f32 values that probe rounding: ties, overflow edges, subnormals, specials, int limits.
std::vector<float> special_values() {
  const float tie_bf16 = 1.0f + std::ldexp(1.0f, -8), up_bf16 = 1.0f + 3 * std::ldexp(1.0f, -8);
  const float tie_f16 = 1.0f + std::ldexp(1.0f, -11), up_f16 = 1.0f + 3 * std::ldexp(1.0f, -11);
  return {0.0f,       -0.0f,       1.0f,      -1.0f,      0.5f,        tie_bf16,    up_bf16,     -tie_bf16,
          tie_f16,    up_f16,      -up_f16,   65504.0f,   65519.0f,    65520.0f,    1e5f,        -1e5f,
          std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), 3 * std::ldexp(1.0f, -25), std::ldexp(1.0f, -14),
          1e-40f,     3.4e38f,     -3.4e38f,  INFINITY,   -INFINITY,   NAN,         127.5f,      128.0f,
          255.9f,     256.0f,      -128.5f,   -129.0f,    2147483520.0f, 3e9f,      -3e9f,       0.1f,
          -2.5f,      2.5f,        3.5f,      1e-3f,      std::ldexp(255.0f, 120), 3.3961776e38f};
}

// One sample list per source dtype; each sample's params name the target dtype.
std::vector<OpSample> cast_sources(DType dt, Generator& g) {
  std::vector<OpSample> s{
      {"random [-300, 300)", {make_input(g, {4, 6}, dt, L::contiguous, -300, 300)}},
      {"transposed", {make_input(g, {5, 3}, dt, L::transposed, -50, 50)}},
      {"sliced small values", {make_input(g, {3, 4}, dt, L::sliced, -3, 3)}},
      {"expanded", {make_input(g, {3, 4}, dt, L::expanded)}},
      {"0-d", {make_input(g, {}, dt, L::contiguous)}},
      {"zero-size", {make_input(g, {2, 0}, dt, L::contiguous)}},
  };
  if (is_floating(dt)) {
    auto sv = special_values();
    s.push_back({"special values", {from_vector(sv, {static_cast<int64_t>(sv.size())}).to(dt)}});
  } else {
    s.push_back({"integer limits", {from_vector(std::vector<int32_t>{2147483647, -2147483647 - 1, 16777217, -129, 128, 255,
                                                                     256, -1, 0, 1, 300},
                                                {11})
                                        .to(dt)}});
  }
  // Random bit patterns of the source type: every exponent, NaNs and Infs included.
  if (dt == DType::f32) {
    std::vector<uint32_t> bits(512);
    for (auto& b : bits) b = static_cast<uint32_t>(g.next_u64());
    s.push_back({"random f32 bit patterns", {from_buffer(bits.data(), DType::f32, {512}, {})}});
  } else if (dt == DType::bf16 || dt == DType::f16) {
    std::vector<uint16_t> bits(512);
    for (auto& b : bits) b = static_cast<uint16_t>(g.next_u64());
    s.push_back({"random 16-bit patterns", {from_buffer(bits.data(), dt, {512}, {})}});
  }
  return s;
}

OpInfoRegistrar reg_cast({
    .op = "to_dtype",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          std::vector<OpSample> all;
          for (OpSample& s : cast_sources(dt, g))
            for (DType target : all_dtypes())
              if (target != dt)
                all.push_back({fmt::format("{} -> {}", s.desc, dtype_name(target)),
                               {s.inputs[0], params({static_cast<int64_t>(target)})}});
          return all;
        },
    .run =
        [](const std::vector<Tensor>& in) {
          const auto target = static_cast<DType>(params_of(in[1])[0]);
          Tensor r = to(in[0], target);
          REQUIRE(r.dtype() == target);
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType from) {
          const auto target = static_cast<DType>(params_of(r[1])[0]);
          return ref_map({r[0]}, [&](const std::vector<double>& a) { return convert_ref(a[0], from, target); });
        },
    .tol = exact_tol,
});

// ---- creation ops: params = {dtype, case index}; created on the params' device ----
DType dtype_param(const std::vector<int64_t>& p) { return static_cast<DType>(p[0]); }
Tensor creation_params(DType dt, size_t k) { return params({static_cast<int64_t>(dt), static_cast<int64_t>(k)}); }
double to_dtype_ref(double v, DType dt) { return convert_ref(is_floating(dt) ? to_f32_ref(v) : v, DType::f32, dt); }

struct FullCase {
  const char* desc;
  Shape shape;
};
const std::vector<FullCase>& full_cases() {
  static const std::vector<FullCase> v{{"[3, 4]", {3, 4}}, {"0-d", {}}, {"zero-size", {2, 0}}, {"[2, 3, 2]", {2, 3, 2}}};
  return v;
}
double full_value(DType dt) {
  if (dt == DType::boolean) return 1;
  if (dt == DType::u8) return 200;
  if (is_integral(dt)) return -3;
  return 0.1;  // rounds (once, from f32) in every float type
}

OpInfoRegistrar reg_full({
    .op = "full",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator&) {
          std::vector<OpSample> s;
          for (size_t k = 0; k < full_cases().size(); ++k) s.push_back({full_cases()[k].desc, {creation_params(dt, k)}});
          return s;
        },
    .run =
        [](const std::vector<Tensor>& in) {
          auto p = params_of(in[0]);
          const DType dt = dtype_param(p);
          const double v = full_value(dt);
          Scalar sv = dt == DType::boolean ? Scalar(true) : is_integral(dt) ? Scalar(static_cast<int64_t>(v)) : Scalar(v);
          Tensor r = full(full_cases()[static_cast<size_t>(p[1])].shape, sv, TensorOptions(dt, in[0].device()));
          REQUIRE(r.dtype() == dt);
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType dt) {
          auto p = params_of(r[0]);
          return Ref(full_cases()[static_cast<size_t>(p[1])].shape, to_dtype_ref(full_value(dt), dt));
        },
    .tol = exact_tol,
});

struct RangeCase {
  const char* desc;
  double start, end, step;
  bool floating_only;
};
const std::vector<RangeCase>& arange_cases() {
  static const std::vector<RangeCase> v{
      {"0..10", 0, 10, 1, false},       {"-5..20 step 3", -5, 20, 3, false}, {"10..0 step -2", 10, 0, -2, false},
      {"empty 3..3", 3, 3, 1, false},   {"0..1 step 0.125", 0, 1, 0.125, true}, {"-1.5..2 step 0.7", -1.5, 2, 0.7, true},
      {"2.5..-1 step -0.5", 2.5, -1, -0.5, true},
  };
  return v;
}

OpInfoRegistrar reg_arange({
    .op = "arange",
    .dtypes = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i8, DType::u8},
    .samples =
        [](DType dt, Generator&) {
          std::vector<OpSample> s;
          for (size_t k = 0; k < arange_cases().size(); ++k)
            if (is_floating(dt) || !arange_cases()[k].floating_only) s.push_back({arange_cases()[k].desc, {creation_params(dt, k)}});
          return s;
        },
    .run =
        [](const std::vector<Tensor>& in) {
          auto p = params_of(in[0]);
          const RangeCase& c = arange_cases()[static_cast<size_t>(p[1])];
          auto num = [&](double v) { return c.floating_only ? Scalar(v) : Scalar(static_cast<int64_t>(v)); };
          return arange(num(c.start), num(c.end), num(c.step), TensorOptions(dtype_param(p), in[0].device()));
        },
    .reference =
        [](const std::vector<Ref>& r, DType dt) {
          const RangeCase& c = arange_cases()[static_cast<size_t>(params_of(r[0])[1])];
          std::vector<double> vals;
          for (double v = c.start; c.step > 0 ? v < c.end - 1e-12 : v > c.end + 1e-12; v = c.start + c.step * static_cast<double>(vals.size()))
            vals.push_back(v);
          Ref o(Shape{static_cast<int64_t>(vals.size())});
          for (size_t i = 0; i < vals.size(); ++i) o.v[i] = to_dtype_ref(vals[i], dt);
          return o;
        },
    .tol = [](DType dt) { return is_floating(dt) ? Tol{1e-6, 0} : Tol{0, 0}; },
});

const std::vector<RangeCase>& linspace_cases() {  // step holds the number of steps
  static const std::vector<RangeCase> v{{"0..1 in 5", 0, 1, 5, false},   {"-1..1 in 7", -1, 1, 7, false},
                                        {"5..-5 in 4", 5, -5, 4, false}, {"one step", 2, 9, 1, false},
                                        {"no steps", 0, 1, 0, false},    {"0..100 in 101", 0, 100, 101, false}};
  return v;
}

OpInfoRegistrar reg_linspace({
    .op = "linspace",
    .dtypes = {DType::f32, DType::bf16, DType::f16, DType::i32},
    .samples =
        [](DType dt, Generator&) {
          std::vector<OpSample> s;
          for (size_t k = 0; k < linspace_cases().size(); ++k) s.push_back({linspace_cases()[k].desc, {creation_params(dt, k)}});
          return s;
        },
    .run =
        [](const std::vector<Tensor>& in) {
          auto p = params_of(in[0]);
          const RangeCase& c = linspace_cases()[static_cast<size_t>(p[1])];
          return linspace(c.start, c.end, static_cast<int64_t>(c.step), TensorOptions(dtype_param(p), in[0].device()));
        },
    .reference =
        [](const std::vector<Ref>& r, DType dt) {
          const RangeCase& c = linspace_cases()[static_cast<size_t>(params_of(r[0])[1])];
          const auto n = static_cast<int64_t>(c.step);
          Ref o(Shape{n});
          for (int64_t i = 0; i < n; ++i) {
            const double v = n == 1 ? c.start : c.start + (c.end - c.start) * static_cast<double>(i) / static_cast<double>(n - 1);
            o.v[static_cast<size_t>(i)] = to_dtype_ref(v, dt);
          }
          return o;
        },
    .tol = default_tol,
});

struct EyeCase {
  const char* desc;
  int64_t n, m;  // m < 0: square
};
const std::vector<EyeCase>& eye_cases() {
  static const std::vector<EyeCase> v{{"3", 3, -1}, {"2 x 4", 2, 4}, {"4 x 2", 4, 2}, {"0 x 3", 0, 3}, {"1", 1, -1}, {"3 x 0", 3, 0}};
  return v;
}

OpInfoRegistrar reg_eye({
    .op = "eye",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator&) {
          std::vector<OpSample> s;
          for (size_t k = 0; k < eye_cases().size(); ++k) s.push_back({eye_cases()[k].desc, {creation_params(dt, k)}});
          return s;
        },
    .run =
        [](const std::vector<Tensor>& in) {
          auto p = params_of(in[0]);
          const EyeCase& c = eye_cases()[static_cast<size_t>(p[1])];
          std::optional<int64_t> m;
          if (c.m >= 0) m = c.m;
          return eye(c.n, m, TensorOptions(dtype_param(p), in[0].device()));
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          const EyeCase& c = eye_cases()[static_cast<size_t>(params_of(r[0])[1])];
          const int64_t m = c.m < 0 ? c.n : c.m;
          Ref o(Shape{c.n, m});
          for (int64_t i = 0; i < c.n; ++i)
            for (int64_t j = 0; j < m; ++j) o.at({i, j}) = i == j ? 1 : 0;
          return o;
        },
    .tol = exact_tol,
});

OpInfoRegistrar reg_random("random", "tests/core/test_cast_creation.cpp: rand/randn/randint moments, ranges, seeding");

}  // namespace

TEST_CASE("cast: the reference rounding model agrees with hand-checked values", "[cast]") {
  CHECK(to_bf16_ref(1.0 + std::ldexp(1.0, -8)) == 1.0);                          // tie -> even
  CHECK(to_bf16_ref(1.0 + 3 * std::ldexp(1.0, -8)) == 1.0 + std::ldexp(1.0, -6));  // tie -> even (up)
  CHECK(to_f16_ref(65519.0) == 65504.0);
  CHECK(std::isinf(to_f16_ref(65520.0)));
  CHECK(to_f16_ref(std::ldexp(1.0, -25)) == 0.0);
  CHECK(to_f16_ref(3 * std::ldexp(1.0, -25)) == std::ldexp(1.0, -23));
  CHECK(convert_ref(-1, DType::i8, DType::u8) == 255);
  CHECK(convert_ref(300, DType::i32, DType::i8) == 44);
  CHECK(convert_ref(-1.5, DType::f32, DType::u8) == 0);
  CHECK(convert_ref(NAN, DType::f32, DType::boolean) == 1);
}

TEST_CASE("cast: every f16 value converts exactly to f32 and back, NaN and Inf kept", "[cast]") {
  std::vector<uint16_t> bits(65536);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i);
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor h = from_buffer(bits.data(), dt, {65536}, {});
    Tensor f = to(h, DType::f32);
    Tensor back = to(f, dt);
    Ref rf = ref_of(f), rh = ref_of(h);
    int64_t bad = 0;
    for (size_t i = 0; i < bits.size(); ++i) {
      const double a = rf.v[i], e = rh.v[i];
      if (std::isnan(e) ? !std::isnan(a) : a != e) ++bad;
    }
    CHECK(bad == 0);
    // Round trip keeps every non-NaN bit pattern (and NaNs stay NaN).
    const auto* b2 = static_cast<const uint16_t*>(back.raw_data());
    int64_t changed = 0;
    for (size_t i = 0; i < bits.size(); ++i)
      if (!std::isnan(rh.v[i]) && b2[i] != bits[i]) ++changed;
    CHECK(changed == 0);
  }
}

TEST_CASE("creation: default dtypes and argument errors", "[creation]") {
  CHECK(full({2}, 2).dtype() == DType::i32);
  CHECK(full({2}, 2.5).dtype() == DType::f32);
  CHECK(full({2}, true).dtype() == DType::boolean);
  CHECK(arange(5).dtype() == DType::i32);
  CHECK(arange(0.0, 1.0, 0.25).dtype() == DType::f32);
  CHECK(arange(0, 5, 1.5).to_vector<float>() == std::vector<float>{0, 1.5, 3, 4.5});
  CHECK(linspace(0, 1, 3).dtype() == DType::f32);
  CHECK(eye(2).to_vector<float>() == std::vector<float>{1, 0, 0, 1});
  CHECK(zeros({2, 3}).to_vector<float>() == std::vector<float>(6, 0.0f));
  CHECK(ones({2}, DType::i8).to_vector<int32_t>() == std::vector<int32_t>{1, 1});
  CHECK(linspace(0, 10, 101).to_vector<float>().back() == 10.0f);  // the end is exact
  expect_error([] { full({2, -1}, 1.0); }, {"full", "-1"});
  expect_error([] { arange(0, 5, 0); }, {"arange", "step"});
  expect_error([] { arange(0, 5, -1); }, {"arange", "5", "-1"});
  expect_error([] { arange(0.0, INFINITY); }, {"arange", "finite"});
  expect_error([] { linspace(0, 1, -1); }, {"linspace", "-1"});
  expect_error([] { eye(-1); }, {"eye", "-1"});
  expect_error([] { eye(2, -3); }, {"eye", "-3"});
  expect_error([] { zeros({2}, TensorOptions("tpu:0")); }, {"tpu"});
  CHECK(full({1}, 1.0).item<double>() == 1.0);
  // 64-bit integers default to i32: a value i32 cannot hold is an error, never a wrapped value;
  // asked for as i64 every bit stays, on the host and through the simulated chip.
  const std::vector<int64_t> wide{1, int64_t{1} << 40, -5, (int64_t{1} << 33) + 7, INT32_MIN};
  expect_error([&] { from_vector(wide); }, {"from_vector", "1099511627776", "element 1", "i64"});
  CHECK(from_vector(std::vector<int64_t>{INT32_MIN, INT32_MAX}).to_vector<int32_t>() ==
        std::vector<int32_t>{INT32_MIN, INT32_MAX});
  const Tensor w = from_vector(wide, Shape{5}, TensorOptions(DType::i64));
  CHECK(w.dtype() == DType::i64);
  CHECK(w.to_vector<int64_t>() == wide);
  CHECK(w.to(Device("sim:0")).to(Device("cpu")).to_vector<int64_t>() == wide);
}

TEST_CASE("random: rand/randn/randint moments and ranges", "[random]") {
  Generator g(42);
  const int64_t n = 20000;
  auto stats = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x;
    const double m = s / static_cast<double>(v.size());
    for (float x : v) s2 += (x - m) * (x - m);
    return std::pair<double, double>{m, s2 / static_cast<double>(v.size() - 1)};
  };
  auto u = rand({n}, {}, &g).to_vector<float>();
  for (float x : u) REQUIRE((x >= 0.0f && x < 1.0f));
  auto [um, uv] = stats(u);
  CHECK(std::fabs(um - 0.5) < 0.01);
  CHECK(std::fabs(uv - 1.0 / 12) < 0.005);

  auto z = randn({n}, {}, &g).to_vector<float>();
  auto [zm, zv] = stats(z);
  CHECK(std::fabs(zm) < 0.03);
  CHECK(std::fabs(zv - 1.0) < 0.04);
  int64_t beyond2 = 0;
  for (float x : z) beyond2 += std::fabs(x) > 2.0f;
  CHECK(std::fabs(static_cast<double>(beyond2) / n - 0.0455) < 0.006);  // two-sided 2-sigma tail

  Tensor ri = randint(-3, 5, {n}, DType::i32, &g);
  CHECK(ri.dtype() == DType::i32);
  std::set<int32_t> seen;
  double s = 0;
  for (int32_t v : ri.to_vector<int32_t>()) {
    REQUIRE((v >= -3 && v < 5));
    seen.insert(v);
    s += v;
  }
  CHECK(seen.size() == 8);
  CHECK(std::fabs(s / n - 0.5) < 0.05);

  // Other dtypes, shapes, and the *_like forms.
  Tensor rb = rand({4, 5}, DType::bf16, &g);
  CHECK(rb.dtype() == DType::bf16);
  for (float x : rb.to_vector<float>()) CHECK((x >= 0.0f && x <= 1.0f));
  CHECK(randn_like(rb, &g).shape() == Shape{4, 5});
  CHECK(rand_like(zeros({2, 0}), &g).numel() == 0);
  CHECK(randint(0, 2, {3}, DType::u8, &g).dtype() == DType::u8);
  CHECK(rand({}, {}, &g).dim() == 0);
  expect_error([&] { rand({2}, DType::i32, &g); }, {"rand", "floating", "i32"});
  expect_error([&] { randn({2}, DType::boolean, &g); }, {"randn", "bool"});
  expect_error([&] { randint(3, 3, {2}, DType::i32, &g); }, {"randint", "3"});
  expect_error([&] { rand({-2}, {}, &g); }, {"-2"});
}

TEST_CASE("random: seeding is reproducible and generators are independent", "[random]") {
  Generator a(7), b(7), c(8);
  auto va = randn({64}, {}, &a).to_vector<float>();
  auto vb = randn({64}, {}, &b).to_vector<float>();
  auto vc = randn({64}, {}, &c).to_vector<float>();
  CHECK(va == vb);
  CHECK(va != vc);
  CHECK(rand({8}, {}, &a).to_vector<float>() != va);  // the stream moves on
  a.manual_seed(7);
  CHECK(randn({64}, {}, &a).to_vector<float>() == va);
  CHECK(a.seed() == 7);

  manual_seed(123);
  auto d1 = randint(0, 1000, {32}).to_vector<int32_t>();
  auto r1 = rand({16}).to_vector<float>();
  manual_seed(123);
  CHECK(randint(0, 1000, {32}).to_vector<int32_t>() == d1);
  CHECK(rand({16}).to_vector<float>() == r1);
  // A private generator does not disturb the default stream.
  manual_seed(5);
  auto x1 = rand({4}).to_vector<float>();
  manual_seed(5);
  Generator other(99);
  rand({100}, {}, &other);
  CHECK(rand({4}).to_vector<float>() == x1);
}

}  // namespace tpu::testing
