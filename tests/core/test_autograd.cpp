// Autograd semantics: accumulation, retain_graph, errors, no-grad, detach, views, in-place
// checks, retain_grad, autograd::grad, double backward, dtypes and devices.
#include <thread>

#include "testing.h"
#include "tpucore/autograd.h"

namespace tpu::testing {
namespace {

Tensor vec(std::vector<float> v) { return from_vector(v); }
std::vector<float> vals(const Tensor& t) { return t.to_vector<float>(); }
void check_vals(const Tensor& t, const std::vector<float>& want, double tol = 1e-5) {
  REQUIRE(t.defined());
  auto got = vals(t);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}

}  // namespace

TEST_CASE("autograd: gradient of a scalar function and accumulation", "[autograd]") {
  Tensor x = vec({1, -2, 3}).requires_grad_();
  Tensor y = sum(mul(x, x));
  CHECK(y.requires_grad());
  CHECK_FALSE(y.is_leaf());
  CHECK(autograd::grad_fn_name(y) == "sum");
  y.backward({}, true);
  check_vals(x.grad(), {2, -4, 6});
  y.backward();  // accumulates
  check_vals(x.grad(), {4, -8, 12});
  x.zero_grad();
  check_vals(x.grad(), {0, 0, 0});
  x.set_grad(Tensor());
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("autograd: backward errors are tpu::Errors naming the problem", "[autograd]") {
  Tensor x = vec({1, 2, 3}).requires_grad_();
  Tensor y = mul(x, x);
  expect_error([&] { y.backward(); }, {"backward", "one element", "[3]"});
  expect_error([&] { y.backward(ones({2})); }, {"backward", "gradient", "[2]", "[3]"});
  Tensor s = sum(y);
  s.backward();
  expect_error([&] { s.backward(); }, {"second time", "retain_graph", "mul"});
  expect_error([&] { sum(vec({1, 2})).backward(); }, {"does not require grad"});
  Tensor am = argmax(x);
  expect_error([&] { am.backward(); }, {"argmax", "not differentiable"});
  Tensor cmp = gt(x, 1.0);
  expect_error([&] { cmp.backward(); }, {"gt", "not differentiable"});
  expect_error([&] { ones({2}, DType::i32).requires_grad_(); }, {"requires_grad_", "floating point", "i32"});
  expect_error([&] { y.requires_grad_(false); }, {"not a leaf", "detach"});
}

TEST_CASE("autograd: retain_graph keeps saved tensors for a second backward", "[autograd]") {
  Tensor x = vec({0.5f, 1.5f}).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward({}, true);
  y.backward();
  check_vals(x.grad(), {2 * std::exp(0.5f), 2 * std::exp(1.5f)});
}

TEST_CASE("autograd: no-grad guard, grad mode is thread-local, detach", "[autograd]") {
  Tensor x = vec({1, 2}).requires_grad_();
  {
    NoGradGuard ng;
    CHECK_FALSE(is_grad_enabled());
    CHECK_FALSE(mul(x, x).requires_grad());
    bool other_thread = false;
    std::thread([&] { other_thread = is_grad_enabled() && mul(x, x).requires_grad(); }).join();
    CHECK(other_thread);
    {
      GradModeGuard on;
      CHECK(mul(x, x).requires_grad());
    }
    CHECK_FALSE(is_grad_enabled());
  }
  CHECK(is_grad_enabled());
  Tensor d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.storage() == x.storage());
  Tensor y = sum(mul(mul(x, x.detach()), 3.0));  // d/dx = 3 x (the detached factor is a constant)
  y.backward();
  check_vals(x.grad(), {3, 6});
}

TEST_CASE("autograd: gradients through views (slice, transpose, expand, reshape, select)", "[autograd]") {
  Generator g(3);
  Tensor base = randn({4, 6}, {}, &g);
  Tensor x = base.clone().requires_grad_();
  // y = sum(w * reshape(transpose(x)[1:5:2, :], [8]).expand([3, 8])) + sum(x[2])
  Tensor v = reshape(x.transpose(0, 1).slice(0, 1, 5, 2), {8}).expand({3, 8});
  Tensor w = randn({3, 8}, {}, &g);
  Tensor y = add(sum(mul(v, w)), sum(x.select(0, 2)));
  y.backward();
  // Expected: element (i, j) of x sits at v[:, k] for j in {1, 3} with k = (j-1)/2 * 4 + i.
  std::vector<float> want(24, 0.f), wv = vals(w);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) {
      float e = i == 2 ? 1.f : 0.f;
      if (j == 1 || j == 3) {
        const int k = (j - 1) / 2 * 4 + i;
        for (int r = 0; r < 3; ++r) e += wv[static_cast<size_t>(r * 8 + k)];
      }
      want[static_cast<size_t>(i * 6 + j)] = e;
    }
  check_vals(x.grad(), want);
}

TEST_CASE("autograd: broadcasting and type promotion reduce and cast the gradients", "[autograd]") {
  Tensor a = ones({3, 1}).requires_grad_();
  Tensor b = full({4}, 2.0, DType::bf16).requires_grad_();
  Tensor y = mul(a, b);  // [3, 4] f32
  CHECK(y.dtype() == DType::f32);
  sum(y).backward();
  CHECK(a.grad().shape() == Shape{3, 1});
  CHECK(b.grad().dtype() == DType::bf16);
  check_vals(a.grad(), {8, 8, 8});
  check_vals(b.grad(), {3, 3, 3, 3});
  // The same gradient tensor reaching two leaves is not shared between their .grad()s.
  Tensor p = ones({2}).requires_grad_(), q = ones({2}).requires_grad_();
  sum(add(p, q)).backward();
  CHECK(p.grad().storage() != q.grad().storage());
}

TEST_CASE("autograd: in-place ops on leaves and on saved tensors are refused", "[autograd]") {
  Tensor x = vec({1, 2, 3}).requires_grad_();
  expect_error([&] { x.add_(1.0); }, {"add_", "leaf", "requires grad", "NoGradGuard"});
  expect_error([&] { x.fill_(0); }, {"fill_", "leaf"});
  expect_error([&] { x.copy_(ones({3})); }, {"copy_", "leaf"});
  {
    NoGradGuard ng;
    x.mul_(2.0);  // allowed without recording
  }
  check_vals(x, {2, 4, 6});
  // A tensor saved for backward modified afterwards: backward fails instead of being wrong.
  Tensor a = mul(x, 1.0);
  Tensor b = sum(mul(a, a));  // saves a
  {
    NoGradGuard ng;
    a.add_(1.0);
  }
  expect_error([&] { b.backward(); }, {"modified by an in-place operation", "mul"});
  // Writing a tensor that requires grad into one that does not, or into a view, is refused.
  Tensor buf = zeros({3});
  expect_error([&] { buf.copy_(x); }, {"copy_", "does not require grad"});
  Tensor h = mul(x, 2.0);
  Tensor hv = h.slice(0, 0, 2);
  expect_error([&] { hv.mul_(2.0); }, {"mul_", "view"});
}

TEST_CASE("autograd: in-place ops on non-leaf tensors are recorded", "[autograd]") {
  Tensor x = vec({-1, 2, 3}).requires_grad_();
  Tensor h = mul(x, 2.0);
  relu_(h);       // h = relu(2x)
  h.mul_(3.0);    // h = 3 relu(2x)
  h.add_(x);      // h = 3 relu(2x) + x
  sum(h).backward();
  check_vals(x.grad(), {1, 7, 7});
  Tensor y = exp(mul(x, 1.0));
  y.add_(1.0);  // exp saved its output, which is now modified
  expect_error([&] { sum(y).backward(); }, {"exp", "in-place"});
}

TEST_CASE("autograd: retain_grad, autograd::grad and double backward", "[autograd]") {
  Tensor x = vec({1, 2}).requires_grad_();
  Tensor h = mul(x, 3.0);
  h.retain_grad();
  Tensor y = sum(mul(h, h));
  y.backward();
  check_vals(h.grad(), {6, 12});
  check_vals(x.grad(), {18, 36});

  Tensor z = vec({0.5f, -1.f}).requires_grad_();
  Tensor f = sum(mul(mul(z, z), z));  // z^3
  auto g1 = autograd::grad({f}, {z}, {}, false, true);
  check_vals(g1[0], {0.75f, 3.f});  // 3 z^2
  CHECK_FALSE(z.grad().defined());  // grad() does not accumulate
  CHECK(g1[0].requires_grad());
  auto g2 = autograd::grad({sum(g1[0])}, {z});
  check_vals(g2[0], {3.f, -6.f});  // 6 z
  Tensor unused = vec({1}).requires_grad_();
  expect_error([&] { autograd::grad({sum(mul(z, 2.0))}, {unused}); }, {"not used", "allow_unused"});
  auto g3 = autograd::grad({sum(mul(z, 2.0))}, {unused}, {}, false, false, true);
  CHECK_FALSE(g3[0].defined());
}

TEST_CASE("autograd: backward on the simulator device", "[autograd]") {
  Tensor x = vec({1, 2, 3}).to(Device("sim:0")).detach().requires_grad_();
  Tensor y = sum(mul(exp(x), x));
  y.backward();
  REQUIRE(x.grad().device() == Device("sim:0"));
  std::vector<float> want;
  for (float v : {1.f, 2.f, 3.f}) want.push_back(std::exp(v) * (1 + v));
  check_vals(x.grad(), want, 1e-5);
}

}  // namespace tpu::testing
