// Elementwise ops beyond the OpInfo table: type promotion (wrapped scalars, 0-d tensors),
// in-place forms, special values, integer edge cases, allclose/equal, and the errors.
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "test_elementwise_util.h"

using namespace tpu;
using tpu::testing::check_close;
using tpu::testing::Ref;

namespace {

Tensor f32v(const std::vector<float>& v) { return from_vector(v); }
Tensor i32v(const std::vector<int32_t>& v) { return from_vector(v); }

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const tpu::Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("elementwise: type promotion of tensors, 0-d tensors and wrapped scalars", "[elementwise]") {
  const Tensor i = i32v({1, 2, 3});
  CHECK((i + 2.5).dtype() == DType::f32);
  CHECK((i + 2.5).to_vector<float>() == std::vector<float>{3.5f, 4.5f, 5.5f});
  CHECK((i + 2).dtype() == DType::i32);
  CHECK((i + scalar_tensor(2.5)).dtype() == DType::f32);  // a 0-d float tensor lifts the category
  CHECK(add(full({2}, 1, DType::u8), full({2}, 1, DType::i8)).dtype() == DType::i32);
  CHECK(add(full({2}, 1, DType::bf16), full({2}, 1, DType::f16)).dtype() == DType::f32);
  // A 0-d tensor of the same category does not widen a dim tensor.
  CHECK(add(full({2}, 1, DType::f16), scalar_tensor(1.0, DType::f32)).dtype() == DType::f16);
  CHECK(add(full({2}, 1, DType::i8), scalar_tensor(1, DType::i32)).dtype() == DType::i8);
  // ...but two dim tensors promote normally.
  CHECK(add(full({2}, 1, DType::f16), full({2}, 1, DType::f32)).dtype() == DType::f32);
  // bool with an integer scalar is an integer; bool + bool stays bool (logical or).
  const Tensor b = from_vector(std::vector<bool>{true, false});
  CHECK((b + 3).dtype() == DType::i32);
  CHECK((b + 3).to_vector<int32_t>() == std::vector<int32_t>{4, 3});
  CHECK(add(b, b).dtype() == DType::boolean);
  CHECK(add(b, b).to_vector<bool>() == std::vector<bool>{true, false});
  CHECK(mul(b, from_vector(std::vector<bool>{true, true})).to_vector<bool>() == std::vector<bool>{true, false});
  CHECK((f32v({1}) + true).dtype() == DType::f32);
  // A u8 tensor with an int scalar stays u8 and wraps like a uint8 cast.
  CHECK((full({1}, 1, DType::u8) + 300).dtype() == DType::u8);
  CHECK((full({1}, 1, DType::u8) + 300).to_vector<int32_t>() == std::vector<int32_t>{45});
  CHECK(mul(full({2}, 1.5, DType::bf16), Scalar(3)).dtype() == DType::bf16);
  CHECK(mul(full({2}, 1.5, DType::bf16), Scalar(3)).to_vector<float>() == std::vector<float>{4.5f, 4.5f});
  // wrap_scalar is a wrapped number: it does not widen the tensor it meets.
  CHECK(wrap_scalar(2.0).impl().wrapped_number);
  CHECK(add(full({2}, 1, DType::f16), wrap_scalar(2.0)).dtype() == DType::f16);
  CHECK((2.0 / full({2}, 4, DType::f16)).dtype() == DType::f16);
  CHECK((2.0 / full({2}, 4, DType::f16)).to_vector<float>() == std::vector<float>{0.5f, 0.5f});
}

TEST_CASE("elementwise: result dtypes of division, comparisons and unary ops", "[elementwise]") {
  const Tensor i = i32v({7, -7, 2, 3});
  CHECK(div(i, i32v({2, 2, 2, 2})).dtype() == DType::f32);
  CHECK(div(i, i32v({2, 2, 2, 2})).to_vector<float>() == std::vector<float>{3.5f, -3.5f, 1.0f, 1.5f});
  CHECK((i / 2).to_vector<float>() == std::vector<float>{3.5f, -3.5f, 1.0f, 1.5f});
  // Comparisons run in the promoted type: 2 == 2.5 is false, 2 < 2.5 is true.
  CHECK(eq(i, 2.5).dtype() == DType::boolean);
  CHECK(eq(i, 2.5).to_vector<bool>() == std::vector<bool>{false, false, false, false});
  CHECK(lt(i, 2.5).to_vector<bool>() == std::vector<bool>{false, true, true, false});
  CHECK(eq(i, 2).to_vector<bool>() == std::vector<bool>{false, false, true, false});
  // u8 200 vs i8 -56: promoted to i32 they differ (no wrap before comparing).
  CHECK(eq(full({1}, 200, DType::u8), full({1}, -56, DType::i8)).to_vector<bool>() == std::vector<bool>{false});
  CHECK(exp(i).dtype() == DType::f32);
  CHECK(sqrt(from_vector(std::vector<bool>{true})).dtype() == DType::f32);
  CHECK(sigmoid(full({2}, 0, DType::u8)).to_vector<float>() == std::vector<float>{0.5f, 0.5f});
  CHECK(exp(full({2}, 0, DType::bf16)).dtype() == DType::bf16);
  for (DType d : {DType::i32, DType::i8, DType::u8}) {
    const Tensor x = full({3}, 2, d);
    CHECK(neg(x).dtype() == d);
    CHECK(abs(x).dtype() == d);
    CHECK(sign(x).dtype() == d);
    CHECK(relu(x).dtype() == d);
    CHECK(clamp(x, 0, 1).dtype() == d);
    CHECK(floor(x).dtype() == d);
    CHECK(round(x).dtype() == d);
  }
  CHECK(clamp(i, 0.5, std::nullopt).dtype() == DType::f32);  // float bound promotes
  CHECK(clamp(i, 0, std::nullopt).to_vector<int32_t>() == std::vector<int32_t>{7, 0, 2, 3});
  CHECK(clamp(i, std::nullopt, 2).to_vector<int32_t>() == std::vector<int32_t>{2, -7, 2, 2});
  const Tensor c = from_vector(std::vector<bool>{true, false, true, false});
  CHECK(where(c, i, 2.5).dtype() == DType::f32);
  CHECK(where(c, i, 2.5).to_vector<float>() == std::vector<float>{7, 2.5f, 2, 2.5f});
  CHECK(where(c, 1, full({4}, 0, DType::f16)).dtype() == DType::f16);
  CHECK(where(c, 1, full({4}, 0, DType::f16)).to_vector<float>() == std::vector<float>{1, 0, 1, 0});
  CHECK(logical_and(i, f32v({1, 0, 0.5f, NAN})).to_vector<bool>() == std::vector<bool>{true, false, true, true});
  CHECK(logical_not(f32v({0, -0.0f, 2, NAN})).to_vector<bool>() == std::vector<bool>{true, true, false, false});
  CHECK(isnan(f32v({0, NAN, INFINITY})).to_vector<bool>() == std::vector<bool>{false, true, false});
  CHECK(isnan(i).to_vector<bool>() == std::vector<bool>{false, false, false, false});
}

TEST_CASE("elementwise: special values", "[elementwise]") {
  const float nan = NAN, inf = INFINITY;
  auto v = [](const Tensor& t) { return t.to_vector<float>(); };
  // NaN propagation through arithmetic and maximum/minimum (from either side).
  CHECK(std::isnan(v(add(f32v({nan}), f32v({1})))[0]));
  CHECK(std::isnan(v(sub(f32v({inf}), f32v({inf})))[0]));
  CHECK(std::isnan(v(maximum(f32v({nan, 1}), f32v({1, nan})))[0]));
  CHECK(std::isnan(v(maximum(f32v({nan, 1}), f32v({1, nan})))[1]));
  CHECK(std::isnan(v(minimum(f32v({nan, 1}), f32v({1, nan})))[1]));
  CHECK(std::isnan(v(maximum(full({2}, nan, DType::bf16), full({2}, 1, DType::bf16)))[0]));
  CHECK(v(div(f32v({1, -1}), f32v({0, 0}))) == std::vector<float>{inf, -inf});
  CHECK(std::isnan(v(relu(f32v({nan})))[0]));
  CHECK(std::isnan(v(sign(f32v({nan})))[0]));
  CHECK(v(sign(f32v({-3, 0, 2}))) == std::vector<float>{-1, 0, 1});
  // round: half to even.
  CHECK(v(round(f32v({0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 2.4f, 2.6f}))) ==
        std::vector<float>{0, 2, 2, -0.0f, -2, -2, 2, 3});
  CHECK(v(round(full({2}, 2.5, DType::bf16))) == std::vector<float>{2, 2});
  // clamp: NaN input stays NaN, a NaN bound gives NaN, min > max gives max (as PyTorch).
  CHECK(std::isnan(v(clamp(f32v({nan}), 0, 1))[0]));
  CHECK(std::isnan(v(clamp(f32v({0.5f}), nan, 1))[0]));
  CHECK(v(clamp(f32v({-5, 0.5f, 5}), 2, 1)) == std::vector<float>{1, 1, 1});
  // where selects NaN branches untouched.
  CHECK(std::isnan(v(where(from_vector(std::vector<bool>{true}), f32v({nan}), f32v({1})))[0]));
  // Transcendentals at their edges through the ops.
  CHECK(v(exp(f32v({-inf, 0, inf}))) == std::vector<float>{0, 1, inf});
  CHECK(v(log(f32v({0, 1, inf}))) == std::vector<float>{-inf, 0, inf});
  CHECK(std::isnan(v(log(f32v({-1})))[0]));
  CHECK(v(tanh(f32v({-inf, inf}))) == std::vector<float>{-1, 1});
  CHECK(v(sigmoid(f32v({-inf, inf}))) == std::vector<float>{0, 1});
}

TEST_CASE("elementwise: gelu in both forms against the closed forms", "[elementwise]") {
  tpu::Generator g(7);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (auto layout : {tpu::testing::Layout::contiguous, tpu::testing::Layout::transposed}) {
      const Tensor x = tpu::testing::make_input(g, {9, 33}, dt, layout, -6.0, 6.0);
      const Ref rx = tpu::testing::ref_of(x);
      const Ref exact = tpu::testing::ref_map({rx}, [](const std::vector<double>& a) {
        return 0.5 * a[0] * (1.0 + std::erf(a[0] / std::sqrt(2.0)));
      });
      const Ref approx = tpu::testing::ref_map({rx}, [](const std::vector<double>& a) {
        const double u = std::sqrt(2.0 / M_PI) * (a[0] + 0.044715 * a[0] * a[0] * a[0]);
        return 0.5 * a[0] * (1.0 + std::tanh(u));
      });
      check_close(gelu(x), exact, tpu::testing::default_tol(dt), "gelu erf form");
      check_close(gelu(x, true), approx, tpu::testing::default_tol(dt), "gelu tanh form");
      CHECK(gelu(x, true).dtype() == dt);
    }
  }
  // The two forms differ (by up to ~1e-3 near |x| = 2), so the attribute really switches.
  CHECK(!equal(gelu(f32v({2.0f})), gelu(f32v({2.0f}), true)));
}

TEST_CASE("elementwise: integer edge cases never trap", "[elementwise]") {
  const Tensor big = i32v({INT_MAX, INT_MIN, 5, -5});
  CHECK((big + 1).to_vector<int32_t>() == std::vector<int32_t>{INT_MIN, INT_MIN + 1, 6, -4});
  CHECK(neg(big).to_vector<int32_t>() == std::vector<int32_t>{-INT_MAX, INT_MIN, -5, 5});
  CHECK(abs(big).to_vector<int32_t>() == std::vector<int32_t>{INT_MAX, INT_MIN, 5, 5});
  CHECK(mul(big, 2).to_vector<int32_t>() == std::vector<int32_t>{-2, 0, 10, -10});
  // fmod by zero is defined as 0; INT_MIN fmod -1 is 0; the sign follows the dividend.
  CHECK(fmod(big, 0).to_vector<int32_t>() == std::vector<int32_t>{0, 0, 0, 0});
  CHECK(fmod(big, -1).to_vector<int32_t>() == std::vector<int32_t>{0, 0, 0, 0});
  CHECK(fmod(i32v({7, -7, 7, -7}), i32v({3, 3, -3, -3})).to_vector<int32_t>() == std::vector<int32_t>{1, -1, 1, -1});
  CHECK(fmod(full({2}, 7, DType::i8), full({2}, 0, DType::i8)).to_vector<int32_t>() == std::vector<int32_t>{0, 0});
  // pow: exact integers, negative exponents as PyTorch, wrap-around on overflow.
  CHECK(pow(i32v({2, 3, -2, 0}), i32v({10, 3, 3, 0})).to_vector<int32_t>() == std::vector<int32_t>{1024, 27, -8, 1});
  CHECK(pow(i32v({1, -1, -1, 2, 0}), i32v({-3, -3, -2, -1, -1})).to_vector<int32_t>() ==
        std::vector<int32_t>{1, -1, 1, 0, 0});
  CHECK(pow(i32v({2}), 31).to_vector<int32_t>() == std::vector<int32_t>{INT_MIN});
  CHECK(pow(i32v({2}), 0.5).dtype() == DType::f32);
  // Division of integers by zero is true division in f32.
  CHECK(div(i32v({1, 0}), i32v({0, 0})).to_vector<float>()[0] == INFINITY);
  CHECK(std::isnan(div(i32v({1, 0}), i32v({0, 0})).to_vector<float>()[1]));
  // i8 and u8 wrap as their own width.
  CHECK(add(full({1}, 100, DType::i8), full({1}, 100, DType::i8)).to_vector<int32_t>() == std::vector<int32_t>{-56});
  CHECK(sub(full({1}, 1, DType::u8), full({1}, 2, DType::u8)).to_vector<int32_t>() == std::vector<int32_t>{255});
}

TEST_CASE("elementwise: in-place forms", "[elementwise][inplace]") {
  SECTION("contiguous self is written in place, version bumped") {
    Tensor x = f32v({1, 2, 3});
    const void* p = x.raw_data();
    const uint64_t v0 = x.impl().version;
    add_(x, f32v({10, 20, 30}));
    CHECK(x.raw_data() == p);
    CHECK(x.impl().version > v0);
    CHECK(x.to_vector<float>() == std::vector<float>{11, 22, 33});
    sub_(x, f32v({1, 1, 1}), 2);
    CHECK(x.to_vector<float>() == std::vector<float>{9, 20, 31});
    mul_(x, f32v({2}));
    div_(x, f32v({2, 4, 31}));
    CHECK(x.to_vector<float>() == std::vector<float>{9, 10, 2});
    x += f32v({1});
    x -= f32v({1});
    x *= f32v({3});
    x /= f32v({3});
    CHECK(x.to_vector<float>() == std::vector<float>{9, 10, 2});
    x.add_(1).mul_(2.0).sub_(f32v({2})).div_(f32v({2}));
    CHECK(x.to_vector<float>() == std::vector<float>{9, 10, 2});
    add_(x, x);  // the same view on both sides
    CHECK(x.to_vector<float>() == std::vector<float>{18, 20, 4});
  }
  SECTION("non-contiguous self and overlapping operands") {
    Tensor base = from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
    Tensor t = base.t();
    t.add_(f32v({100, 200}));  // broadcast over t's last dim [3, 2]
    CHECK(base.to_vector<float>() == std::vector<float>{100, 101, 102, 203, 204, 205});
    Tensor v = f32v({1, 2, 3, 4, 5});
    Tensor head = v.slice(0, 0, 4);
    head.add_(v.slice(0, 1, 5));  // reads ahead of the writes: must use the original values
    CHECK(v.to_vector<float>() == std::vector<float>{3, 5, 7, 9, 5});
    Tensor w = f32v({1, 2, 3});
    Tensor w0 = w.slice(0, 0, 1);
    w.add_(w0.expand({3}));  // every element adds the original w[0]
    CHECK(w.to_vector<float>() == std::vector<float>{2, 3, 4});
  }
  SECTION("dtype rules: the result is cast back to self's dtype when PyTorch allows it") {
    Tensor i = i32v({1, 2});
    i.mul_(3);
    CHECK(i.dtype() == DType::i32);
    CHECK(i.to_vector<int32_t>() == std::vector<int32_t>{3, 6});
    Tensor u = full({2}, 250, DType::u8);
    add_(u, full({2}, 10, DType::i8));  // promoted to i32, written back as u8 (wraps)
    CHECK(u.to_vector<int32_t>() == std::vector<int32_t>{4, 4});
    Tensor h = full({2}, 1, DType::bf16);
    add_(h, f32v({0.5f, 1.5f}));
    CHECK(h.dtype() == DType::bf16);
    CHECK(h.to_vector<float>() == std::vector<float>{1.5f, 2.5f});
    Tensor bb = from_vector(std::vector<bool>{false, true});
    add_(bb, from_vector(std::vector<bool>{true, false}));
    CHECK(bb.to_vector<bool>() == std::vector<bool>{true, true});
    const std::string e1 = error_of([&] { add_(i, f32v({1.5f, 1})); });
    CHECK(contains(e1, "add_"));
    CHECK(contains(e1, "f32"));
    CHECK(contains(e1, "i32"));
    CHECK(contains(error_of([&] { i.mul_(2.5); }), "mul_"));
    CHECK(contains(error_of([&] { div_(i, i32v({1, 1})); }), "div_"));
    CHECK(contains(error_of([&] { add_(bb, i32v({1, 1})); }), "bool"));
    CHECK(i.to_vector<int32_t>() == std::vector<int32_t>{3, 6});  // untouched by the failed calls
  }
  SECTION("self must already have the broadcast shape") {
    Tensor x = f32v({1, 2, 3, 4});
    const std::string e = error_of([&] { add_(x, from_vector(std::vector<float>(12, 1.0f), {3, 4})); });
    CHECK(contains(e, "add_"));
    CHECK(contains(e, "[4]"));
    CHECK(contains(e, "[3, 4]"));
  }
  SECTION("an expanded self is refused") {
    Tensor e = f32v({1}).expand({3});
    const std::string msg = error_of([&] { add_(e, f32v({1, 2, 3})); });
    CHECK(contains(msg, "add_"));
    CHECK(contains(msg, "expanded"));
  }
  SECTION("relu_") {
    Tensor x = f32v({-1, 2, NAN});
    relu_(x);
    CHECK(x.to_vector<float>()[0] == 0.0f);
    CHECK(std::isnan(x.to_vector<float>()[2]));
    Tensor i = i32v({-3, 3});
    relu_(i);
    CHECK(i.to_vector<int32_t>() == std::vector<int32_t>{0, 3});
    Tensor t = from_vector(std::vector<float>{-1, 2, -3, 4}, {2, 2}).t();
    relu_(t);
    CHECK(t.to_vector<float>() == std::vector<float>{0, 0, 2, 4});
    Tensor b = from_vector(std::vector<bool>{true});
    CHECK(contains(error_of([&] { relu_(b); }), "relu"));
  }
}

TEST_CASE("elementwise: allclose and equal", "[elementwise]") {
  const Tensor a = f32v({1, 2, 3});
  CHECK(allclose(a, f32v({1, 2, 3.00001f})));
  CHECK(!allclose(a, f32v({1, 2, 3.1f})));
  CHECK(allclose(a, f32v({1, 2, 3.1f}), 0, 0.2));
  CHECK(allclose(f32v({INFINITY, -INFINITY}), f32v({INFINITY, -INFINITY})));
  CHECK(!allclose(f32v({INFINITY}), f32v({-INFINITY})));
  CHECK(!allclose(f32v({NAN}), f32v({NAN})));
  CHECK(allclose(f32v({NAN}), f32v({NAN}), 1e-5, 1e-8, true));
  CHECK(allclose(from_vector(std::vector<float>{2, 2, 2, 2}, {2, 2}), f32v({2})));  // broadcasts
  CHECK(allclose(i32v({1, 2}), f32v({1, 2})));                                     // mixed dtypes
  CHECK(allclose(a.t(), a));
  CHECK(allclose(full({0}, 1), full({0}, 2)));
  CHECK(equal(a, f32v({1, 2, 3})));
  CHECK(!equal(a, f32v({1, 2, 4})));
  CHECK(!equal(a, f32v({1, 2})));
  CHECK(!equal(f32v({NAN}), f32v({NAN})));
  CHECK(equal(i32v({INT_MAX}), i32v({INT_MAX})));
  CHECK(!equal(i32v({INT_MAX}), i32v({INT_MAX - 1})));  // exact for large ints
  CHECK(contains(error_of([&] { allclose(a, f32v({1, 2})); }), "allclose"));
  CHECK(contains(error_of([&] { allclose(a, a, -1.0); }), "rtol"));
}

TEST_CASE("elementwise: errors name the op and the offending shapes or dtypes", "[elementwise][errors]") {
  const Tensor a3 = f32v({1, 2, 3}), a4 = f32v({1, 2, 3, 4});
  const Tensor b = from_vector(std::vector<bool>{true, false});
  const Tensor i = i32v({1, 2});
  struct Bad {
    std::string what;
    std::function<void()> call;
    std::vector<std::string> parts;
  };
  const std::vector<Bad> bad = {
      {"add shape mismatch", [&] { add(a3, a4); }, {"add", "[3]", "[4]"}},
      {"mul shape mismatch", [&] { mul(from_vector(std::vector<float>(6, 1.0f), {2, 3}), a4); }, {"mul", "[2, 3]", "[4]"}},
      {"eq shape mismatch", [&] { eq(a3, a4); }, {"eq", "[3]", "[4]"}},
      {"logical_or shape mismatch", [&] { logical_or(a3, a4); }, {"logical_or", "[3]", "[4]"}},
      {"where shape mismatch", [&] { where(from_vector(std::vector<bool>{true, false}), a3, a3); }, {"where", "[2]", "[3]"}},
      {"sub of bools", [&] { sub(b, b); }, {"sub", "bool", "logical_xor"}},
      {"sub with a bool", [&] { sub(b, i); }, {"sub", "bool"}},
      {"neg of bool", [&] { neg(b); }, {"neg", "bool", "logical_not"}},
      {"relu of bool", [&] { relu(b); }, {"relu", "bool"}},
      {"pow of bools", [&] { pow(b, b); }, {"pow", "bool"}},
      {"fmod of bools", [&] { fmod(b, b); }, {"fmod", "bool"}},
      {"where with int condition", [&] { where(i, a3, a3); }, {"where", "condition", "i32"}},
      {"clamp without bounds", [&] { clamp(a3, std::nullopt, std::nullopt); }, {"clamp", "min", "max"}},
      {"clamp of bool", [&] { clamp(b, false, true); }, {"clamp", "bool"}},
      {"float alpha for ints", [&] { add(i, i, 0.5); }, {"add", "alpha", "i32"}},
      {"bool alpha for floats", [&] { add(a3, a3, true); }, {"add", "alpha", "bool"}},
      {"undefined input", [&] { add(a3, Tensor()); }, {"add", "undefined"}},
      {"undefined unary input", [&] { exp(Tensor()); }, {"exp", "undefined"}},
  };
  for (const Bad& e : bad) {
    INFO(e.what);
    const std::string msg = error_of(e.call);
    INFO("message: " << msg);
    for (const std::string& p : e.parts) CHECK(contains(msg, p));
  }
  // The runtime keeps working afterwards.
  CHECK((a3 + a3).to_vector<float>() == std::vector<float>{2, 4, 6});
}

TEST_CASE("elementwise: large inputs take the parallel and vectorized paths correctly", "[elementwise]") {
  tpu::Generator g(3);
  // Above the parallel grain, with a broadcast operand and a transposed one.
  const Tensor x = tpu::testing::make_input(g, {300, 257}, DType::f32, tpu::testing::Layout::contiguous);
  const Tensor y = tpu::testing::make_input(g, {257}, DType::f32, tpu::testing::Layout::contiguous);
  const Tensor z = tpu::testing::make_input(g, {300, 257}, DType::f32, tpu::testing::Layout::transposed);
  const Ref rx = tpu::testing::ref_of(x), ry = tpu::testing::ref_of(y), rz = tpu::testing::ref_of(z);
  check_close(relu(x * y + z), tpu::testing::ref_map({rx, ry, rz}, [](const std::vector<double>& v) {
                double s = v[0] * v[1] + v[2];
                return s < 0 ? 0.0 : s;
              }), tpu::testing::default_tol(DType::f32), "relu(x*y+z)");
  check_close(add(x, z, -0.5), tpu::testing::ref_map({rx, rz}, [](const std::vector<double>& v) { return v[0] - 0.5 * v[1]; }),
              tpu::testing::default_tol(DType::f32), "add alpha");
  check_close(y - x, tpu::testing::ref_map({ry, rx}, [](const std::vector<double>& v) { return v[0] - v[1]; }),
              tpu::testing::default_tol(DType::f32), "broadcast lhs sub");
  check_close(tanh(z), tpu::testing::ref_map({rz}, [](const std::vector<double>& v) { return std::tanh(v[0]); }),
              tpu::testing::default_tol(DType::f32), "tanh strided");
}
