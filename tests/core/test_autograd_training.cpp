// End-to-end training: an MLP learns a synthetic 4-class problem (Gaussian blobs in 16-d) with
// SGD+momentum and with AdamW; the loss must fall and the accuracy must be far above chance.
// When Debian's dataset-fashion-mnist is installed, a short run on a slice of it must also learn.
#include "testing.h"
#include "tpucore/data.h"
#include "tpucore/nn.h"

namespace tpu::testing {
namespace {

struct Blobs {
  Tensor x, y;
};
Blobs make_blobs(int64_t n, int64_t dim, int64_t classes, Generator& g) {
  Tensor centers = mul(randn({classes, dim}, {}, &g), 2.0);
  Tensor y = randint(0, classes, {n}, DType::i32, &g);
  Tensor x = add(index_select(centers, 0, y), randn({n, dim}, {}, &g));
  return {x, y};
}

double accuracy(nn::Module& m, const Tensor& x, const Tensor& y) {
  NoGradGuard ng;
  return sum(eq(argmax(m.forward(x), 1), y)).item<double>() / static_cast<double>(x.size(0));
}

template <class Opt>
std::pair<double, double> train(nn::Module& model, Opt& opt, const Blobs& d, int steps, int64_t batch) {
  double first = 0, last = 0;
  const int64_t n = d.x.size(0);
  for (int s = 0; s < steps; ++s) {
    const int64_t start = (s * batch) % (n - batch);
    Tensor xb = d.x.narrow(0, start, batch), yb = d.y.narrow(0, start, batch);
    Tensor loss = nn::cross_entropy(model.forward(xb), yb);
    opt.zero_grad();
    loss.backward();
    opt.step();
    const double l = loss.item<double>();
    if (s < 5) first += l / 5;
    if (s >= steps - 5) last += l / 5;
  }
  return {first, last};
}

}  // namespace

TEST_CASE("training: an MLP learns synthetic blobs with SGD and with AdamW", "[autograd][training]") {
  Generator g(11);
  Blobs all = make_blobs(1536, 16, 4, g);
  Blobs train_set{all.x.narrow(0, 0, 1024), all.y.narrow(0, 0, 1024)};
  Blobs test_set{all.x.narrow(0, 1024, 512), all.y.narrow(0, 1024, 512)};
  for (int which = 0; which < 2; ++which) {
    INFO((which == 0 ? "SGD" : "AdamW"));
    Generator init(5);
    nn::MLP model({16, 32, 4}, "relu", 0.0, &init);
    std::pair<double, double> losses;
    if (which == 0) {
      optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
      losses = train(model, opt, train_set, 120, 32);
    } else {
      optim::AdamW opt(model.parameters(), {.lr = 3e-3});
      losses = train(model, opt, train_set, 120, 32);
    }
    INFO("loss " << losses.first << " -> " << losses.second);
    CHECK(losses.second < 0.5 * losses.first);
    const double acc = accuracy(model, test_set.x, test_set.y);
    INFO("test accuracy " << acc);
    CHECK(acc > 0.85);  // chance is 0.25
  }
}

TEST_CASE("training: a slice of Fashion-MNIST (skipped when the dataset package is absent)", "[autograd][training]") {
  if (!data::fashion_mnist_available()) {
    WARN("dataset-fashion-mnist is not installed; skipping");
    return;
  }
  data::TensorDataset full = data::load_fashion_mnist(data::Split::train);
  const int64_t n = 3072;
  Tensor x = div(reshape(full.inputs.narrow(0, 0, n), {n, 784}).to(DType::f32), 255.0);
  Tensor y = full.targets.narrow(0, 0, n);
  Blobs tr{x.narrow(0, 0, 2560).contiguous(), y.narrow(0, 0, 2560).contiguous()};
  Generator init(3);
  nn::MLP model({784, 64, 10}, "relu", 0.0, &init);
  optim::AdamW opt(model.parameters(), {.lr = 2e-3});
  auto [first, last] = train(model, opt, tr, 160, 64);
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
  const double acc = accuracy(model, x.narrow(0, 2560, 512), y.narrow(0, 2560, 512));
  INFO("held-out accuracy " << acc);
  CHECK(acc > 0.7);  // chance is 0.1
}

}  // namespace tpu::testing
