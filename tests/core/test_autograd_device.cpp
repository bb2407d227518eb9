// to(device) of a tensor that requires grad is recorded by autograd: the gradient moves back to
// the source device (checked against the closed form).
#include "codegen_testing.h"
#include "tpucore/autograd.h"

namespace tpu::testing {
namespace {

TEST_CASE("autograd: to(device) is differentiable, the gradient moves back", "[autograd]") {
  TinySim sim;
  Tensor w = from_vector<float>({1, -2, 3, 4, 0.5f, -1}, {2, 3}).requires_grad_();
  Tensor ws = w.to(sim.dev());
  CHECK(ws.requires_grad());
  CHECK(autograd::grad_fn_name(ws) == "to_device");
  Tensor loss = (ws * ws).sum();  // d/dw = 2 w
  loss.backward();
  REQUIRE(w.grad().defined());
  CHECK(w.grad().device() == Device());
  const std::vector<float> g = w.grad().to_vector<float>(), x = w.to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(2 * x[i]).epsilon(1e-2));
  {
    NoGradGuard ng;
    CHECK_FALSE(w.to(sim.dev()).requires_grad());
  }
  // and back: sim -> cpu
  Tensor v = from_vector<float>({2, 3}, {2}).to(sim.dev()).requires_grad_();
  Tensor l2 = (v.to(Device()) * 3.0).sum();
  l2.backward();
  REQUIRE(v.grad().defined());
  CHECK(v.grad().device() == sim.dev());
  for (float e : v.grad().to(Device()).to_vector<float>()) CHECK(e == Approx(3.0));
}

}  // namespace
}  // namespace tpu::testing
