// Data-parallel training of the Fashion-MNIST MLP (784-256-10, ReLU, AdamW, cosine schedule) on
// the chips of one simulated pod, driven from one thread (single controller): the sibling of
// train_fashion_mnist_ddp (gloo, one process per rank) on tpu::dist's sim backend.
//
//   train_fashion_mnist_sim_pod [--sim-pod 4] [--epochs 3] [--batch-size 64] [--lr 3e-3] [--limit N]
//                               [--compute host|chip] [--expect-acc 0.5]
//
// The pod is TPU_SIM_POD (default 2x2 for 4 chips, 2 for 2); rank r is chip sim:r. Every rank
// has its own model replica (same seed; rank 0's parameters broadcast over the ICI), its own
// 1/world of the training set and batches of batch-size/world. Each step, rank r's gradients are
// packed into one flat bucket in sim:r's HBM; the controller posts every rank's
// all_reduce_async(avg) and waits for all of them (the pod moves the buckets over the ICI and
// averages them), then each rank's optimizer steps. --compute host (default) runs the replicas'
// forward/backward on the host and only the gradient exchange on the chips; --compute chip puts
// each replica on its chip (slow: every op is simulated). The simulated ICI time per step is
// printed (chip preset: TPU_SIM_CHIP, default this build's).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "device/sim_driver.h"
#include "device/sim_pod.h"
#include "tools/cli_args.h"
#include "tpucore/data.h"
#include "tpucore/dist.h"
#include "tpucore/nn.h"
#include "tpucore/core/parallel.h"

using namespace tpu;

namespace {

struct Args {
  int64_t chips = 4, epochs = 3, batch = 64, limit = 0;
  double lr = 3e-3;
  uint64_t seed = 1;
  double expect_acc = 0;  // fail below this final test accuracy (smoke tests)
  std::string data_dir, compute = "host";
};

data::TensorDataset shard(const data::TensorDataset& d, int64_t limit, int rank, int world) {
  int64_t n = limit > 0 && limit < d.size() ? limit : d.size();
  int64_t per = n / world;
  return {d.inputs.narrow(0, per * rank, per).contiguous(), d.targets.narrow(0, per * rank, per).contiguous()};
}

double accuracy(nn::Module& model, data::DataLoader& loader, Device dev) {
  NoGradGuard ng;
  model.eval();
  double correct = 0;
  for (const auto& [x, y] : loader)
    correct += sum(eq(argmax(model.forward(x.to(dev)), 1).to(Device()), y)).item<double>();
  model.train();
  return correct / static_cast<double>(loader.num_samples());
}

struct Replica {
  Device dev;
  std::shared_ptr<nn::MLP> model;
  std::vector<Tensor> params;
  Tensor bucket;  // every gradient, flat, in this rank's chip HBM
  std::unique_ptr<data::DataLoader> loader;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::CosineAnnealingLR> schedule;
};

int run(const Args& args) {
  const int world = static_cast<int>(args.chips);
  if (world < 1) fail("train_fashion_mnist_sim_pod: --sim-pod {} must be at least 1", world);
  if (args.batch % world != 0) fail("train_fashion_mnist_sim_pod: --batch-size {} is not a multiple of {} chips", args.batch, world);
  if (args.compute != "host" && args.compute != "chip") fail("train_fashion_mnist_sim_pod: --compute is host or chip, not '{}'", args.compute);
  // Before the first sim device exists (the pod then sizes the device count).
  if (!std::getenv("TPU_SIM_POD")) setenv("TPU_SIM_POD", world == 4 ? "2x2" : std::to_string(world).c_str(), 1);
  if (!data::fashion_mnist_available(args.data_dir)) {
    std::fprintf(stderr, "Fashion-MNIST not found in %s; install it with: sudo apt-get install dataset-fashion-mnist\n",
                 data::fashion_mnist_dir(args.data_dir).c_str());
    return 2;
  }
  auto groups = dist::sim_pod_groups({world});
  const data::TensorDataset all = data::load_fashion_mnist(data::Split::train, args.data_dir);
  std::vector<Replica> reps(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    Replica& p = reps[static_cast<size_t>(r)];
    Device chip(DeviceType::sim, r);
    p.dev = args.compute == "chip" ? chip : Device();
    Generator init(args.seed);
    p.model = std::make_shared<nn::MLP>(std::vector<int64_t>{784, 256, 10}, "relu", 0.0, &init);
    if (args.compute == "chip") p.model->to(chip);
    p.params = p.model->parameters();
    int64_t total = 0;
    for (auto& t : p.params) total += t.numel();
    p.bucket = zeros(Shape{total}, TensorOptions(DType::f32, chip));
    p.loader = std::make_unique<data::DataLoader>(
        shard(all, args.limit, r, world),
        data::DataLoaderOptions{.batch_size = args.batch / world, .shuffle = true,
                                .seed = args.seed * 1000 + static_cast<uint64_t>(r), .drop_last = true,
                                .transform = data::to_float(1.0 / 255.0, true)});
    p.opt = std::make_unique<optim::AdamW>(p.params, optim::AdamWOptions{.lr = args.lr, .weight_decay = 1e-4});
    p.schedule = std::make_unique<optim::CosineAnnealingLR>(*p.opt, args.epochs * p.loader->size(), args.lr * 0.05);
  }
  // Rank 0's parameters to every chip (as DDP does), one async broadcast per rank and tensor.
  for (size_t i = 0; i < reps[0].params.size(); ++i) {
    std::vector<dist::Work> ws;
    std::vector<Tensor> staged;
    for (int r = 0; r < world; ++r) {
      staged.push_back(reps[size_t(r)].params[i].detach().to(Device(DeviceType::sim, r)));
      ws.push_back(groups[size_t(r)]->broadcast_async(staged.back(), 0));
    }
    for (int r = 0; r < world; ++r) {
      ws[size_t(r)].wait();
      reps[size_t(r)].params[i].detach().copy_(staged[size_t(r)]);
    }
  }
  const int64_t steps = reps[0].loader->size();
  std::printf("data parallel on %d simulated chips (sim backend, pod %s, compute on %s): %lld samples per chip, "
              "batch %lld per chip (%lld global), %lld steps/epoch\n",
              world, device::sim_pod_shape().c_str(), args.compute.c_str(),
              static_cast<long long>(reps[0].loader->num_samples()), static_cast<long long>(args.batch / world),
              static_cast<long long>(args.batch), static_cast<long long>(steps));
  auto ici_time = [] { return device::sim_device(0).queue().stream_time(device::kDefaultStream); };
  double final_acc = 0;
  for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
    std::vector<data::DataLoader::Iterator> its;
    for (auto& p : reps) {
      p.loader->set_epoch(epoch);
      its.push_back(p.loader->begin());
    }
    double loss_sum = 0, ici = 0;
    for (int64_t s = 0; s < steps; ++s) {
      std::vector<dist::Work> ws;
      for (int r = 0; r < world; ++r) {  // each replica's step, then its bucket's all_reduce posted
        Replica& p = reps[size_t(r)];
        const auto& [x, y] = *its[size_t(r)];
        p.opt->zero_grad();
        Tensor loss = nn::cross_entropy(p.model->forward(x.to(p.dev)), y.to(p.dev));
        loss.backward();
        int64_t off = 0;
        for (auto& t : p.params) {
          p.bucket.narrow(0, off, t.numel()).copy_(t.grad().reshape(Shape{t.numel()}));
          off += t.numel();
        }
        loss_sum += loss.item<double>() / world;
        ws.push_back(groups[size_t(r)]->all_reduce_async(p.bucket, dist::ReduceOp::avg));
      }
      const double t0 = ici_time();
      for (auto& w : ws) w.wait();
      device::sim_device(0).queue().synchronize();
      ici += ici_time() - t0;
      for (int r = 0; r < world; ++r) {
        Replica& p = reps[size_t(r)];
        Tensor avg = p.bucket.to(p.dev);
        int64_t off = 0;
        for (auto& t : p.params) {
          t.grad().copy_(avg.narrow(0, off, t.numel()).reshape(t.shape()));
          off += t.numel();
        }
        p.opt->step();
        p.schedule->step();
        ++its[size_t(r)];
      }
    }
    data::DataLoader test(data::load_fashion_mnist(data::Split::test, args.data_dir),
                          {.batch_size = 1000, .transform = data::to_float(1.0 / 255.0, true)});
    final_acc = accuracy(*reps[0].model, test, reps[0].dev);
    std::printf("epoch %lld/%lld  train loss %.4f (mean over chips)  test acc %.2f%%  simulated ICI %.3f ms/step\n",
                static_cast<long long>(epoch + 1), static_cast<long long>(args.epochs),
                loss_sum / static_cast<double>(std::max<int64_t>(steps, 1)), 100.0 * final_acc,
                1e3 * ici / static_cast<double>(std::max<int64_t>(steps, 1)));
    std::fflush(stdout);
  }
  // The replicas must hold the same parameters.
  for (int r = 1; r < world; ++r)
    for (size_t i = 0; i < reps[0].params.size(); ++i)
      if (!allclose(reps[size_t(r)].params[i].to(Device()), reps[0].params[i].to(Device()), 0, 0))
        fail("train_fashion_mnist_sim_pod: chip {}'s parameter {} differs from chip 0's", r, i);
  std::printf("final test accuracy %.2f%%; parameters identical on all %d chips\n", 100.0 * final_acc, world);
  if (final_acc < args.expect_acc)
    fail("train_fashion_mnist_sim_pod: test accuracy {:.2f}% is below --expect-acc {:.2f}%", 100 * final_acc, 100 * args.expect_acc);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  cli::Parser p("train_fashion_mnist_sim_pod", "Data-parallel Fashion-MNIST on the chips of one simulated pod (tpu::dist sim backend).");
  p.value("--sim-pod", "N", "chips (default 4; the pod is TPU_SIM_POD, else 2x2 / N)", [&](const std::string& v) { a.chips = p.to_int(v); });
  p.value("--epochs", "N", "epochs (default 3)", [&](const std::string& v) { a.epochs = p.to_int(v); });
  p.value("--batch-size", "N", "global batch (default 64)", [&](const std::string& v) { a.batch = p.to_int(v); });
  p.value("--lr", "X", "peak learning rate (default 3e-3)", [&](const std::string& v) { a.lr = p.to_double(v); });
  p.value("--limit", "N", "use the first N training samples (default all)", [&](const std::string& v) { a.limit = p.to_int(v); });
  p.value("--seed", "N", "seed (default 1)", [&](const std::string& v) { a.seed = static_cast<uint64_t>(p.to_int(v)); });
  p.value("--data-dir", "DIR", "Fashion-MNIST directory", [&](const std::string& v) { a.data_dir = v; });
  p.value("--compute", "host|chip", "where the replicas' forward/backward run (default host)", [&](const std::string& v) { a.compute = v; });
  p.value("--expect-acc", "X", "fail if the final test accuracy is below X (0..1)", [&](const std::string& v) { a.expect_acc = p.to_double(v); });
  if (auto rc = p.parse(argc, argv)) return *rc;
  try {
    set_num_threads(1);
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
