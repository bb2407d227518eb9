// Post-accumulate-grad hooks and reachable_leaves (tpucore/autograd.h), against closed-form
// gradients: y = sum(w * x) + sum(w * w) uses w twice, so its hook must fire once per backward,
// after both contributions (grad = x + 2w).
#include <catch2/catch.hpp>

#include "tpucore/autograd.h"
#include "tpucore/ops.h"

using namespace tpu;
using Catch::Matchers::Contains;

TEST_CASE("autograd: a post-accumulate-grad hook fires once per backward with the full gradient", "[autograd]") {
  Tensor w = from_vector(std::vector<float>{1, 2, 3}, Shape{3}).requires_grad_();
  Tensor x = from_vector(std::vector<float>{4, 5, 6}, Shape{3});
  Tensor unused = from_vector(std::vector<float>{1}, Shape{1}).requires_grad_();
  std::vector<std::vector<float>> seen;
  int unused_calls = 0;
  int id = autograd::register_post_accumulate_grad_hook(w, [&](const Tensor& g) { seen.push_back(g.to_vector<float>()); });
  autograd::register_post_accumulate_grad_hook(unused, [&](const Tensor&) { ++unused_calls; });
  auto y = [&] { return add(sum(mul(w, x)), sum(mul(w, w))); };
  y().backward();
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == std::vector<float>{6, 9, 12});  // x + 2w
  y().backward();  // accumulates: the hook sees the sum of both passes
  REQUIRE(seen.size() == 2);
  CHECK(seen[1] == std::vector<float>{12, 18, 24});
  CHECK(unused_calls == 0);  // no gradient reached it
  autograd::remove_post_accumulate_grad_hook(w, id);
  y().backward();
  CHECK(seen.size() == 2);
  (void)autograd::grad({y()}, {w});  // autograd::grad does not accumulate, so no hook
  CHECK(seen.size() == 2);
  CHECK_THROWS_WITH(autograd::register_post_accumulate_grad_hook(x, [](const Tensor&) {}),
                    Contains("must be a leaf that requires grad"));
}

TEST_CASE("autograd: reachable_leaves tells which leaves a root depends on", "[autograd]") {
  Tensor a = ones(Shape{2}).requires_grad_(), b = ones(Shape{2}).requires_grad_(), c = ones(Shape{2}).requires_grad_();
  Tensor root = sum(mul(relu(a), b));
  CHECK(autograd::reachable_leaves(root, {a, b, c}) == std::vector<bool>{true, true, false});
  CHECK(autograd::reachable_leaves(a, {a, b}) == std::vector<bool>{true, false});  // a leaf root reaches itself
}
