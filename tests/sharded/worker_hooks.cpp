// Module forward hooks (order, replaced inputs and outputs, removal, always_call on a failing
// forward) checked against closed forms; fully_shard through the hooks of a CausalLM called as
// it is; parallelize_module's errors. One rank.
#include <cstring>
#include <functional>
#include <stdexcept>

#include "model.h"
#include "tpucore/models.h"
#include "tpucore/nn/parallel/fsdp.h"
#include "tpucore/nn/parallel/parallelize.h"

namespace sharded_test {

namespace {

// y[i][o] = sum_k x[i][k] w[o][k] + b[o], by loops over host vectors.
std::vector<float> naive_linear(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                                int64_t rows, int64_t in, int64_t out) {
  std::vector<float> y(static_cast<size_t>(rows * out));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[static_cast<size_t>(o)];
      for (int64_t k = 0; k < in; ++k) s += double(x[size_t(i * in + k)]) * w[size_t(o * in + k)];
      y[size_t(i * out + o)] = static_cast<float>(s);
    }
  return y;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

struct Failing : nn::Module {
  Tensor forward(const Tensor&) override { throw std::runtime_error("forward failed"); }
};

}  // namespace

int scenario_hooks() {
  Generator g(3);
  auto lin = std::make_shared<nn::Linear>(3, 2, true, &g);
  Tensor x = randn(Shape{4, 3}, {}, &g);
  std::vector<float> xv = x.to_vector<float>(), wv = lin->weight.detach().contiguous().to_vector<float>(),
                     bv = lin->bias.detach().to_vector<float>();
  std::vector<int> order;
  auto h1 = lin->register_forward_pre_hook([&](nn::Module&, std::vector<Tensor>& in) {
    order.push_back(1);
    in[0] = mul(in[0], 2.0);
  });
  auto h2 = lin->register_forward_hook([&](nn::Module&, std::span<const Tensor> in, Tensor& y) {
    order.push_back(2);
    check(in.size() == 1 && in[0].size(1) == 3, "the post hook sees the (replaced) input");
    y = add(y, 1.0);
  });
  // (2x) W^T + b + 1
  std::vector<float> x2 = xv;
  for (float& v : x2) v *= 2;
  std::vector<float> want = naive_linear(x2, wv, bv, 4, 3, 2);
  for (float& v : want) v += 1;
  check(max_diff((*lin)(x).to_vector<float>(), want) < 1e-5, "hooks replace the input and the output");
  check(order == std::vector<int>({1, 2}), "pre hook, then post hook");
  check(max_diff(lin->forward(x).to_vector<float>(), naive_linear(xv, wv, bv, 4, 3, 2)) < 1e-5,
        "forward() skips the hooks");
  h1.remove();
  h2.remove();
  h2.remove();  // a second remove is a no-op
  check(!lin->has_forward_hooks(), "removed");
  check(max_diff((*lin)(x).to_vector<float>(), naive_linear(xv, wv, bv, 4, 3, 2)) < 1e-5, "no hooks: plain forward");

  // always_call: runs with an undefined output when the forward throws; the others do not run.
  auto bad = std::make_shared<Failing>();
  int plain = 0, always = 0;
  bad->register_forward_hook([&](nn::Module&, std::span<const Tensor>, Tensor&) { ++plain; });
  bad->register_forward_hook(
      [&](nn::Module&, std::span<const Tensor>, Tensor& y) {
        ++always;
        check(!y.defined(), "a failed forward's output is undefined");
      },
      true);
  bool threw = false;
  try {
    (*bad)(x);
  } catch (const std::runtime_error&) {
    threw = true;
  }
  check(threw && plain == 0 && always == 1, "the error propagates after the always_call hook ran");

  // fully_shard through the hooks of a CausalLM called as it is (one rank: the same numbers as
  // the model without sharding), and the units' memory after forward and after backward.
  auto cfg = models::ModelConfig::from_json(
      R"({"model_type": "qwen3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8})");
  Generator g1(5), g2(5);
  auto plain_lm = std::make_shared<models::CausalLM>(cfg, &g1);
  auto lm = std::make_shared<models::CausalLM>(cfg, &g2);
  for (auto& l : lm->model->layers) nn::parallel::fully_shard(l, dist::world());
  auto root = nn::parallel::fully_shard(lm, dist::world());
  Tensor ids = from_vector(std::vector<int64_t>{1, 5, 7, 2, 9, 30}, Shape{1, 6});
  Tensor want_logits = plain_lm->forward(ids);
  Tensor got = (*lm)(ids);
  check(max_abs_diff(got, want_logits) < 1e-5, "the sharded model called as it is gives the same logits");
  const auto after_fwd = root->memory_stats();
  int64_t root_bytes = 0;
  for (auto& [n, p] : plain_lm->named_parameters())
    if (n.rfind("model.layers.", 0) != 0) root_bytes += static_cast<int64_t>(p.nbytes());
  check(after_fwd.gathered_bytes == root_bytes,
        fmt::format("after forward only the root stays gathered: {} bytes, want {}", after_fwd.gathered_bytes,
                    root_bytes));
  lm_loss(got, ids).backward();
  lm_loss(want_logits, ids).backward();
  check(root->memory_stats().gathered_bytes == 0, "after backward nothing stays gathered");
  auto pg = plain_lm->named_parameters();
  auto sg = lm->named_parameters();
  check(pg.size() == sg.size(), "same parameters");
  for (size_t i = 0; i < std::min(pg.size(), sg.size()); ++i)
    check(sg[i].second.grad().defined() && max_abs_diff(sg[i].second.grad(), pg[i].second.grad()) < 1e-5,
          "gradient of " + sg[i].first);

  // Plans: a pattern matching nothing, a column style on a norm.
  auto lm2 = std::make_shared<models::CausalLM>(cfg, &g1);
  check_error([&] { nn::parallel::parallelize_module(*lm2, dist::world(), {{"model.layers.*.attn", nn::parallel::ColwiseParallel()}}); },
              "matches no module", "unknown pattern");
  check_error([&] { nn::parallel::parallelize_module(*lm2, dist::world(), {{"model.norm", nn::parallel::ColwiseParallel()}}); },
              "needs a Linear", "column style on a norm");
  return 0;
}

}  // namespace sharded_test
