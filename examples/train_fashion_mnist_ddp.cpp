// Data-parallel training of the Fashion-MNIST MLP (784-256-10, ReLU, AdamW, cosine schedule) on
// several processes over gloo:
//
//   tpu-run -n 2 ./train_fashion_mnist_ddp [--epochs 3] [--batch-size 64] [--lr 3e-3] [--limit N]
//
// Every rank builds the same model, wraps it in nn::parallel::DistributedDataParallel (which broadcasts
// rank 0's parameters and averages the gradients in buckets with all_reduce(avg) while backward
// runs), and trains on its own 1/world of the training set with batches of batch-size/world, so
// the ranks stay identical and a step equals a single-process step on the global batch. Rank 0
// evaluates on the test set and prints.
#include <cstdio>
#include <optional>
#include <string>

#include "tpucore/data.h"
#include "tpucore/dist.h"
#include "tpucore/nn.h"
#include "tpucore/nn/parallel/ddp.h"
#include "tpucore/core/parallel.h"
#include "tools/cli_args.h"

using namespace tpu;

namespace {

struct Args {
  int64_t epochs = 3, batch = 64, limit = 0;
  double lr = 3e-3;
  uint64_t seed = 1;
  std::string data_dir;
};

std::optional<int> parse(int argc, char** argv, Args& a) {
  cli::Parser p("train_fashion_mnist_ddp",
                "Data-parallel Fashion-MNIST training over tpu::dist (run it with tpu-run -n N).");
  p.value("--epochs", "N", "epochs to train (default 3)", [&](const std::string& v) { a.epochs = p.to_int(v); });
  p.value("--batch-size", "N", "global batch size, split over the ranks (default 64)",
          [&](const std::string& v) { a.batch = p.to_int(v); });
  p.value("--lr", "X", "peak learning rate (default 3e-3)", [&](const std::string& v) { a.lr = p.to_double(v); });
  p.value("--limit", "N", "train on the first N samples only", [&](const std::string& v) { a.limit = p.to_int(v); });
  p.value("--data-dir", "DIR", "dataset folder (default: Debian's dataset-fashion-mnist)",
          [&](const std::string& v) { a.data_dir = v; });
  p.value("--seed", "S", "shuffle seed (default 1)", [&](const std::string& v) { a.seed = uint64_t(p.to_int(v)); });
  return p.parse(argc, argv);
}

// Rank r's contiguous 1/world of the first `limit` samples (all when limit is 0).
data::TensorDataset shard(const data::TensorDataset& d, int64_t limit, int rank, int world) {
  int64_t n = limit > 0 && limit < d.size() ? limit : d.size();
  int64_t per = n / world;
  return {d.inputs.narrow(0, per * rank, per).contiguous(), d.targets.narrow(0, per * rank, per).contiguous()};
}

double accuracy(nn::Module& model, data::DataLoader& loader) {
  NoGradGuard ng;
  model.eval();
  double correct = 0;
  for (const auto& [x, y] : loader) correct += sum(eq(argmax(model.forward(x), 1), y)).item<double>();
  model.train();
  return correct / static_cast<double>(loader.num_samples());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args;
    if (auto rc = parse(argc, argv, args)) return *rc;
    dist::init_process_group();  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from tpu-run
    const int rank = dist::get_rank(), world = dist::get_world_size();
    if (args.batch % world != 0) fail("train_fashion_mnist_ddp: --batch-size {} is not a multiple of {} ranks", args.batch, world);
    if (!data::fashion_mnist_available(args.data_dir)) {
      std::fprintf(stderr, "Fashion-MNIST not found in %s; install it with: sudo apt-get install dataset-fashion-mnist\n",
                   data::fashion_mnist_dir(args.data_dir).c_str());
      return 2;
    }
    set_num_threads(1);  // one core per rank
    data::TensorDataset train = shard(data::load_fashion_mnist(data::Split::train, args.data_dir), args.limit, rank, world);
    data::DataLoader loader(train, {.batch_size = args.batch / world, .shuffle = true, .seed = args.seed * 1000 + static_cast<uint64_t>(rank),
                                    .drop_last = true, .transform = data::to_float(1.0 / 255.0, true)});

    Generator init(args.seed);
    auto model = std::make_shared<nn::MLP>(std::vector<int64_t>{784, 256, 10}, "relu", 0.0, &init);
    nn::parallel::DistributedDataParallel ddp(model);  // broadcasts rank 0's parameters
    std::vector<Tensor> params = model->parameters();
    optim::AdamW opt(params, {.lr = args.lr, .weight_decay = 1e-4});
    const int64_t steps = loader.size();
    optim::CosineAnnealingLR schedule(opt, args.epochs * steps, args.lr * 0.05);
    if (rank == 0)
      std::printf("data parallel on %d ranks (gloo): %lld samples per rank, batch %lld per rank (%lld global), %lld steps/epoch\n",
                  world, static_cast<long long>(train.size()), static_cast<long long>(args.batch / world),
                  static_cast<long long>(args.batch), static_cast<long long>(steps));
    double final_acc = 0;
    for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
      loader.set_epoch(epoch);
      double loss_sum = 0;
      int64_t n = 0;
      for (const auto& [x, y] : loader) {
        opt.zero_grad();
        Tensor loss = nn::cross_entropy(ddp.forward(x), y);
        loss.backward();  // returns with .grad() averaged over the ranks
        opt.step();
        schedule.step();
        loss_sum += loss.item<double>();
        ++n;
      }
      Tensor mean_loss = full(Shape{1}, loss_sum / static_cast<double>(std::max<int64_t>(n, 1)));
      dist::all_reduce(mean_loss, dist::ReduceOp::avg);
      if (rank == 0) {
        data::DataLoader test(data::load_fashion_mnist(data::Split::test, args.data_dir),
                              {.batch_size = 1000, .transform = data::to_float(1.0 / 255.0, true)});
        final_acc = accuracy(*model, test);
        std::printf("epoch %lld/%lld  train loss %.4f (mean over ranks)  test acc %.2f%%\n",
                    static_cast<long long>(epoch + 1), static_cast<long long>(args.epochs),
                    mean_loss.item<double>(), 100.0 * final_acc);
        std::fflush(stdout);
      }
    }
    // The ranks must hold the same parameters: compare a checksum.
    Tensor sum_p = zeros(Shape{1}), max_p = zeros(Shape{1});
    for (auto& p : params) sum_p.add_(p.detach().sum().reshape(Shape{1}));
    max_p.copy_(sum_p);
    dist::all_reduce(max_p, dist::ReduceOp::max);
    dist::all_reduce(sum_p, dist::ReduceOp::min);
    if (sum_p.item<double>() != max_p.item<double>()) fail("train_fashion_mnist_ddp: the ranks' parameters diverged");
    if (rank == 0) std::printf("final test accuracy %.2f%%; parameters identical on all %d ranks\n", 100.0 * final_acc, world);
    dist::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
