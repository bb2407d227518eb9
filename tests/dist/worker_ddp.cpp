// Scenario "ddp": DistributedDataParallel on 2-4 gloo ranks against single-process training on
// the full global batch, computed in this same process (independent path: no wrapper, no
// communication, the whole batch at once): losses step by step and final parameters; gradient
// accumulation under no_sync; unused parameters with and without find_unused_parameters.
#include <fmt/format.h>

#include <cmath>

#include "tpucore/nn.h"
#include "tpucore/nn/parallel/ddp.h"
#include "tpucore/optim.h"
#include "worker_common.h"

namespace dist_test {

namespace {

using tpu::nn::parallel::DistributedDataParallel;

constexpr int64_t kPerRank = 4, kIn = 6, kClasses = 3;

// Global batch `step` (same on every rank): inputs [n, kIn] and integer class targets [n].
std::pair<Tensor, Tensor> batch(int64_t step, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n * kIn));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t j = 0; j < kIn; ++j)
      x[static_cast<size_t>(s * kIn + j)] = static_cast<float>(std::sin(0.7 * double(s) + 1.3 * double(j) + 0.4 * double(step)));
    y[static_cast<size_t>(s)] = (s * 5 + step) % kClasses;
  }
  return {tpu::from_vector(x, Shape{n, kIn}), tpu::from_vector(y, Shape{n})};
}

// A net whose `extra` layer the forward may skip.
struct Net : tpu::nn::Module {
  std::shared_ptr<tpu::nn::Linear> fc1, fc2, fc3, extra;
  bool use_extra = false;
  explicit Net(uint64_t seed) {
    tpu::Generator g(seed);
    fc1 = register_module("fc1", std::make_shared<tpu::nn::Linear>(kIn, 16, true, &g));
    fc2 = register_module("fc2", std::make_shared<tpu::nn::Linear>(16, 8, true, &g));
    fc3 = register_module("fc3", std::make_shared<tpu::nn::Linear>(8, kClasses, true, &g));
    extra = register_module("extra", std::make_shared<tpu::nn::Linear>(8, 8, true, &g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = tpu::relu(fc2->forward(tpu::relu(fc1->forward(x))));
    if (use_extra) h = tpu::relu(extra->forward(h));
    return fc3->forward(h);
  }
};

double max_param_diff(const tpu::nn::Module& a, const tpu::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  double d = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    auto va = values(pa[i].second), vb = values(pb[i].second);
    for (size_t k = 0; k < va.size(); ++k) d = std::max(d, std::fabs(double(va[k]) - double(vb[k])));
  }
  return d;
}

// This rank's rows of a global batch.
Tensor mine(const Tensor& t, int rank) { return t.narrow(0, rank * kPerRank, kPerRank).contiguous(); }

}  // namespace

int scenario_ddp() {
  const int rank = tpu::dist::get_rank(), world = tpu::dist::get_world_size();
  const int64_t global = kPerRank * world;
  const tpu::optim::SGDOptions sgd{.lr = 0.2, .momentum = 0.9};

  // 1. Plain synchronized steps; the ranks start from different weights (rank 0's win).
  {
    auto net = std::make_shared<Net>(100 + static_cast<uint64_t>(rank));
    tpu::nn::parallel::DDPOptions o;
    o.bucket_cap_bytes = 200;  // several buckets, so some start while backward still runs
    DistributedDataParallel ddp(net, o);
    auto ref = std::make_shared<Net>(100);  // what rank 0 started from
    net->use_extra = ref->use_extra = true;
    check(max_param_diff(*net, *ref) == 0, "parameters broadcast from rank 0");
    tpu::optim::SGD opt(net->parameters(), sgd), ref_opt(ref->parameters(), sgd);
    for (int64_t step = 0; step < 4; ++step) {
      auto [x, y] = batch(step, global);
      opt.zero_grad();
      Tensor loss = tpu::nn::cross_entropy(ddp.forward(mine(x, rank)), mine(y, rank));
      loss.backward();
      opt.step();
      ref_opt.zero_grad();
      Tensor ref_loss = tpu::nn::cross_entropy(ref->forward(x), y);
      ref_loss.backward();
      ref_opt.step();
      Tensor mean = loss.detach().reshape(Shape{1}).clone();
      tpu::dist::all_reduce(mean, tpu::dist::ReduceOp::avg);
      check(std::fabs(mean.item<double>() - ref_loss.item<double>()) < 1e-5,
            fmt::format("step {}: mean loss {} vs single process {}", step, mean.item<double>(), ref_loss.item<double>()));
    }
    double d = max_param_diff(*net, *ref);
    check(d < 2e-5, fmt::format("final parameters equal single-process training (max diff {})", d));
    check(ddp.stats().buckets >= 3, fmt::format("{} buckets", ddp.stats().buckets));
    check(ddp.stats().overlapped_buckets >= 4, "buckets started while backward still ran");
    check(ddp.stats().synced_backwards == 4, "4 synchronized backward passes");

    // 2. Gradient accumulation: 3 micro-batches per step, the first two under no_sync.
    for (int64_t step = 0; step < 2; ++step) {
      opt.zero_grad();
      ref_opt.zero_grad();
      for (int64_t micro = 0; micro < 3; ++micro) {
        auto [x, y] = batch(10 + step * 3 + micro, global);
        if (micro < 2) {
          auto guard = ddp.no_sync();
          tpu::nn::cross_entropy(ddp.forward(mine(x, rank)), mine(y, rank)).backward();
        } else {
          tpu::nn::cross_entropy(ddp.forward(mine(x, rank)), mine(y, rank)).backward();
        }
        tpu::nn::cross_entropy(ref->forward(x), y).backward();
      }
      opt.step();
      ref_opt.step();
    }
    d = max_param_diff(*net, *ref);
    check(d < 2e-5, fmt::format("no_sync accumulation equals single-process accumulation (max diff {})", d));
    check(ddp.stats().synced_backwards == 6, "no_sync passes did not communicate");
  }

  // 3. A layer the forward skips: found with find_unused_parameters (it gets zero gradients and
  //    stays put), an error naming it without.
  {
    auto net = std::make_shared<Net>(7 + static_cast<uint64_t>(rank));
    tpu::nn::parallel::DDPOptions o;
    o.find_unused_parameters = true;
    DistributedDataParallel ddp(net, o);
    auto ref = std::make_shared<Net>(7);
    tpu::optim::SGD opt(net->parameters(), sgd), ref_opt(ref->parameters(), sgd);
    const auto extra_before = values(net->extra->weight);
    for (int64_t step = 0; step < 3; ++step) {
      auto [x, y] = batch(20 + step, global);
      opt.zero_grad();
      tpu::nn::cross_entropy(ddp.forward(mine(x, rank)), mine(y, rank)).backward();
      opt.step();
      ref_opt.zero_grad();
      tpu::nn::cross_entropy(ref->forward(x), y).backward();
      ref_opt.step();
    }
    double d = max_param_diff(*net, *ref);
    check(d < 2e-5, fmt::format("with an unused layer: parameters equal single-process training (max diff {})", d));
    check(values(net->extra->weight) == extra_before, "the unused layer did not move");
  }
  {
    auto net = std::make_shared<Net>(9);
    DistributedDataParallel ddp(net);
    auto [x, y] = batch(30, global);
    tpu::nn::cross_entropy(ddp.forward(mine(x, rank)), mine(y, rank)).backward();
    bool named = false;
    try {
      ddp.forward(mine(x, rank));
    } catch (const tpu::Error& e) {
      named = std::string(e.what()).find("extra.weight") != std::string::npos &&
              std::string(e.what()).find("find_unused_parameters") != std::string::npos;
    }
    check(named, "an unused parameter without find_unused_parameters is an error naming it");
    net->use_extra = true;  // the wrapper stays usable
    tpu::nn::cross_entropy(ddp.forward(mine(x, rank)), mine(y, rank)).backward();
    check(ddp.stats().synced_backwards == 1, "synchronized once the forward uses every parameter");
  }
  return 0;
}

}  // namespace dist_test
