// Trains an MLP (784-256-10, ReLU) on Fashion-MNIST with AdamW and a cosine learning-rate
// schedule, prints a progress bar and a summary line per epoch (loss, accuracy, samples/s) and
// the test accuracy, and saves a checkpoint (model + optimizer + epoch, safetensors) after each
// epoch; --resume continues from it. With --compiled the training step (forward, loss, backward,
// AdamW update) is one graph traced by tpu::compile; the learning rate of the schedule is a
// runtime argument, so it compiles once per batch shape (the last, shorter batch of an epoch
// is a second signature).
//
//   train_fashion_mnist [--epochs 3] [--batch-size 64] [--lr 3e-3] [--device cpu|sim:0]
//                       [--compiled] [--checkpoint fashion_mnist_mlp.safetensors] [--resume]
//                       [--limit N] [--data-dir DIR] [--seed S]
//
// The data comes from Debian's dataset-fashion-mnist package (or --data-dir /
// $TPU_FASHION_MNIST_DIR). On sim:0 the simulator computes every chip program, which is slow:
// use --limit for a short run there.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "tools/cli_args.h"
#include "tpucore/compile.h"
#include "tpucore/data.h"
#include "tpucore/nn.h"
#include "tpucore/safetensors.h"

using namespace tpu;

namespace {

struct Args {
  int64_t epochs = 3, batch = 64, limit = 0;
  double lr = 3e-3;
  uint64_t seed = 1;
  std::string device = "cpu", checkpoint = "fashion_mnist_mlp.safetensors", data_dir;
  bool resume = false, compiled = false;
};

// nullopt: run with `a`; else the exit code (0 after --help, 2 after a bad argument).
std::optional<int> parse(int argc, char** argv, Args& a) {
  cli::Parser p("train_fashion_mnist",
                "Trains a 784-256-10 MLP on Fashion-MNIST with AdamW and a cosine schedule, checkpointing\n"
                "after each epoch.");
  p.value("--epochs", "N", "epochs to train (default 3)", [&](const std::string& v) { a.epochs = p.to_int(v); });
  p.value("--batch-size", "N", "batch size (default 64)", [&](const std::string& v) { a.batch = p.to_int(v); });
  p.value("--lr", "X", "peak learning rate (default 3e-3)", [&](const std::string& v) { a.lr = p.to_double(v); });
  p.value("--device", "DEV", "cpu or sim:0 (default cpu)", [&](const std::string& v) { a.device = v; });
  p.flag("--compiled", "the training step as one tpu::compile graph", [&] { a.compiled = true; });
  p.value("--checkpoint", "FILE", "checkpoint path (default fashion_mnist_mlp.safetensors)",
          [&](const std::string& v) { a.checkpoint = v; });
  p.flag("--resume", "continue from the checkpoint", [&] { a.resume = true; });
  p.value("--limit", "N", "train on the first N samples only", [&](const std::string& v) { a.limit = p.to_int(v); });
  p.value("--data-dir", "DIR", "dataset folder (default: Debian's dataset-fashion-mnist)",
          [&](const std::string& v) { a.data_dir = v; });
  p.value("--seed", "S", "shuffle seed (default 1)", [&](const std::string& v) { a.seed = uint64_t(p.to_int(v)); });
  return p.parse(argc, argv);
}

data::TensorDataset head(data::TensorDataset d, int64_t n) {
  if (n <= 0 || n >= d.size()) return d;
  return {d.inputs.narrow(0, 0, n).contiguous(), d.targets.narrow(0, 0, n).contiguous()};
}

// Accuracy (fraction) and mean loss of the model over a loader, without recording gradients.
std::pair<double, double> evaluate(nn::Module& model, data::DataLoader& loader) {
  NoGradGuard ng;
  model.eval();
  double correct = 0, loss = 0;
  for (const auto& [x, y] : loader) {
    Tensor logits = model.forward(x);
    loss += nn::cross_entropy(logits, y, {.reduction = nn::Reduction::sum}).item<double>();
    correct += sum(eq(argmax(logits, 1), y)).item<double>();
  }
  model.train();
  const double n = static_cast<double>(loader.num_samples());
  return {correct / n, loss / n};
}

void progress(int64_t epoch, int64_t epochs, int64_t done, int64_t total, double loss, bool tty) {
  if (!tty) return;
  constexpr int kWidth = 30;
  const int fill = static_cast<int>(kWidth * done / std::max<int64_t>(total, 1));
  std::printf("\repoch %lld/%lld [%s%s] %lld/%lld loss %.4f", static_cast<long long>(epoch),
              static_cast<long long>(epochs), std::string(static_cast<size_t>(fill), '#').c_str(),
              std::string(static_cast<size_t>(kWidth - fill), '.').c_str(), static_cast<long long>(done),
              static_cast<long long>(total), loss);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args;
    if (auto rc = parse(argc, argv, args)) return *rc;
    const Device dev(args.device);
    if (!data::fashion_mnist_available(args.data_dir)) {
      std::fprintf(stderr, "Fashion-MNIST not found in %s; install it with: sudo apt-get install dataset-fashion-mnist\n",
                   data::fashion_mnist_dir(args.data_dir).c_str());
      return 2;
    }
    data::TensorDataset train = head(data::load_fashion_mnist(data::Split::train, args.data_dir), args.limit);
    data::TensorDataset test = data::load_fashion_mnist(data::Split::test, args.data_dir);
    data::DataLoader train_loader(train, {.batch_size = args.batch,
                                          .shuffle = true,
                                          .seed = args.seed,
                                          .transform = data::to_float(1.0 / 255.0, true),
                                          .device = dev});
    data::DataLoader test_loader(test, {.batch_size = 1000, .transform = data::to_float(1.0 / 255.0, true), .device = dev});

    Generator init(args.seed);
    auto model = std::make_shared<nn::MLP>(std::vector<int64_t>{784, 256, 10}, "relu", 0.0, &init);
    model->to(dev);
    optim::AdamW opt(model->parameters(), {.lr = args.lr, .weight_decay = 1e-4});
    const int64_t steps_per_epoch = train_loader.size();
    optim::CosineAnnealingLR schedule(opt, args.epochs * steps_per_epoch, args.lr * 0.05);

    int64_t start_epoch = 0;
    if (args.resume) {
      auto ck = read_safetensors(args.checkpoint, dev);
      nn::StateDict model_sd, opt_sd;
      for (auto& [k, t] : ck.tensors) {
        if (k.rfind("model.", 0) == 0) model_sd[k.substr(6)] = t;
        else if (k.rfind("optim.", 0) == 0) opt_sd[k.substr(6)] = t;
      }
      model->load_state_dict(model_sd);
      opt.load_state_dict(opt_sd);
      start_epoch = std::stoll(ck.metadata.at("epoch"));
      for (int64_t s = 0; s < start_epoch * steps_per_epoch; ++s) schedule.step();
      std::printf("resumed from %s after epoch %lld\n", args.checkpoint.c_str(), static_cast<long long>(start_epoch));
    }
    std::printf("Fashion-MNIST: %lld train / %lld test samples, MLP 784-256-10 (%lld parameters) on %s, batch %lld\n",
                static_cast<long long>(train.size()), static_cast<long long>(test.size()),
                static_cast<long long>(model->num_parameters()), dev.str().c_str(), static_cast<long long>(args.batch));
    const bool tty = isatty(fileno(stdout));

    // One training step: returns the mean loss and the number of correct predictions.
    auto train_step = [&](const Tensor& x, const Tensor& y, double lr) {
      opt.zero_grad();
      Tensor logits = model->forward(x);
      Tensor loss = nn::cross_entropy(logits, y);
      loss.backward();
      opt.set_lr(lr);
      opt.step();
      NoGradGuard ng;
      return std::make_tuple(loss.detach(), sum(eq(argmax(logits, 1), y)));
    };
    auto compiled_step = compile(train_step, {.name = "train_step"});

    for (int64_t epoch = start_epoch; epoch < args.epochs; ++epoch) {
      train_loader.set_epoch(epoch);
      const auto t0 = std::chrono::steady_clock::now();
      double loss_sum = 0, correct = 0;
      int64_t seen = 0, step = 0;
      for (const auto& [x, y] : train_loader) {
        auto [loss, right] = args.compiled ? compiled_step(x, y, opt.lr()) : train_step(x, y, opt.lr());
        schedule.step();
        const int64_t n = x.size(0);
        loss_sum += loss.item<double>() * static_cast<double>(n);
        correct += right.item<double>();
        seen += n;
        if (++step % 20 == 0 || step == steps_per_epoch)
          progress(epoch + 1, args.epochs, step, steps_per_epoch, loss_sum / static_cast<double>(seen), tty);
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      auto [test_acc, test_loss] = evaluate(*model, test_loader);
      if (tty) std::printf("\n");
      std::printf("epoch %lld/%lld  loss %.4f  train acc %.2f%%  %.0f samples/s  (%.1f s)  test loss %.4f  test acc %.2f%%\n",
                  static_cast<long long>(epoch + 1), static_cast<long long>(args.epochs),
                  loss_sum / static_cast<double>(seen), 100.0 * correct / static_cast<double>(seen),
                  static_cast<double>(seen) / secs, secs, test_loss, 100.0 * test_acc);
      std::fflush(stdout);
      TensorList ck;
      for (auto& [k, t] : model->state_dict()) ck.emplace_back("model." + k, t);
      for (auto& [k, t] : opt.state_dict()) ck.emplace_back("optim." + k, t);
      save_safetensors(args.checkpoint, ck, {{"epoch", std::to_string(epoch + 1)}, {"model", "mlp-784-256-10"}});
    }
    auto [test_acc, test_loss] = evaluate(*model, test_loader);
    std::printf("final test accuracy %.2f%% (loss %.4f); checkpoint %s\n", 100.0 * test_acc, test_loss,
                args.checkpoint.c_str());
    const jit::Stats jit_stats = jit::stats();
    if (args.compiled)
      if (const jit::FunctionStats* st = jit_stats.find("train_step"))
        std::printf("compiled step: %lld compiles (%.0f ms tracing + optimizing), %lld cache hits, %lld graph breaks\n",
                    static_cast<long long>(st->compiles), st->compile_ms, static_cast<long long>(st->hits),
                    static_cast<long long>(st->breaks));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
