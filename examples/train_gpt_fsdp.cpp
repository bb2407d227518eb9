// A small byte-level GPT (the Llama-style model family of tpucore/models: RoPE, grouped KV heads,
// SwiGLU, RMSNorm, tied embeddings) trained with fully sharded data parallelism (fully_shard,
// tpucore/nn/parallel/fsdp.h) and, in the same process, on one device with the same global batch
// and seed; prints both loss curves and their largest difference.
//
//   tpu-run -n 2 train_gpt_fsdp [options]      FSDP over gloo, one process per rank (127.0.0.1)
//   train_gpt_fsdp --sim-pod 4 [options]       FSDP on the chips of a simulated pod (sim backend)
//   train_gpt_fsdp [options]                   one device only
//
// The corpus is the Debian `fortunes` package (as train_fortunes), or a synthetic text when it
// is absent. Each step draws a global batch of --batch sequences of --seq + 1 bytes from a
// generator seeded by (--seed, step); rank r of W trains on rows [r B/W, (r+1) B/W). The
// one-device reference calls the model's own forward (CausalLM::forward) on the whole batch with
// no sharding code; the sharded run calls the same forward, the FSDP units gathering and
// releasing their parameters in the layers' forward hooks. With --tol X the program fails when
// the curves differ by more than X (the CTest smoke runs use it).
//
// Sim pod: rank r is chip sim:r of TPU_SIM_POD (default 2x2 for 4 chips), one thread per rank.
// --compute host (default) keeps each rank's parameters and compute on the host and moves the
// all-gathers and reduce-scatters over the simulated ICI; --compute chip puts each rank's model
// in its chip's HBM (every op simulated: slow, use a tiny model).
#include <chrono>
#include <cstdlib>
#include <thread>

#include "device/sim_driver.h"
#include "device/sim_pod.h"
#include "fortunes_model.h"
#include "tools/cli_args.h"
#include "tpucore/compile.h"
#include "tpucore/core/parallel.h"
#include "tpucore/devices.h"
#include "tpucore/dist.h"
#include "tpucore/nn/parallel/fsdp.h"

namespace fs = std::filesystem;
using namespace tpu;
using nn::parallel::FSDPModule;

namespace {

struct Args {
  int64_t steps = 200, layers = 4, hidden = 96, inter = 256, heads = 4, kv_heads = 2, batch = 8, seq = 64;
  int64_t sim_pod = 0;
  double lr = 1e-3, tol = 0;
  uint64_t seed = 1;
  std::string corpus = "/usr/share/games/fortunes", compute = "host", chip_precision = "highest";
  bool no_reference = false, compiled = false;
};

models::ModelConfig config_of(const Args& a) {
  models::ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 257;  // bytes and <|endoftext|>
  c.hidden_size = a.hidden;
  c.intermediate_size = a.inter;
  c.num_hidden_layers = a.layers;
  c.num_attention_heads = a.heads;
  c.num_key_value_heads = a.kv_heads;
  c.max_position_embeddings = std::max<int64_t>(256, a.seq);
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  return c;
}

// Every rank and the reference build the same model from the same seed.
std::shared_ptr<models::CausalLM> make_model(const Args& a) {
  Generator gen(a.seed);
  auto m = std::make_shared<models::CausalLM>(config_of(a), &gen);
  NoGradGuard ng;
  mul_(m->model->embed_tokens->weight, full({}, 0.02));  // GPT-style small init of the tied embedding
  return m;
}

struct Corpus {
  std::vector<int32_t> ids;
  std::string source;
};

// The fortunes, or (absent) a deterministic text of words drawn from a small vocabulary.
Corpus load_corpus(const Args& a) {
  Corpus c;
  if (fs::is_directory(a.corpus)) c.ids = fortunes::read_corpus(a.corpus);
  if (c.ids.size() > 10000) {
    c.source = "fortunes (" + a.corpus + ")";
    return c;
  }
  static const char* words[] = {"the", "a", "cat", "dog", "sat", "on", "mat", "and", "ran", "far",
                                "away", "while", "birds", "sang", "in", "trees", "of", "green", "old", "town"};
  std::mt19937_64 rng(a.seed);
  std::uniform_int_distribution<int> w(0, 19), len(4, 12);
  while (c.ids.size() < 200000) {
    for (int i = len(rng); i > 0; --i) {
      for (const char* p = words[w(rng)]; *p; ++p) c.ids.push_back(static_cast<unsigned char>(*p));
      c.ids.push_back(i > 1 ? ' ' : '.');
    }
    c.ids.push_back(static_cast<int32_t>(fortunes::kEot));
  }
  c.source = "synthetic text (no fortunes in " + a.corpus + ")";
  return c;
}

// The global batch of `step`: inputs and next-byte targets, [batch, seq] each.
std::pair<Tensor, Tensor> global_batch(const Corpus& c, const Args& a, int64_t step) {
  std::mt19937_64 rng(a.seed * 1000003 + static_cast<uint64_t>(step));
  std::uniform_int_distribution<size_t> pick(0, c.ids.size() - static_cast<size_t>(a.seq) - 2);
  std::vector<int32_t> x(static_cast<size_t>(a.batch * a.seq)), y(x.size());
  for (int64_t b = 0; b < a.batch; ++b) {
    const size_t o = pick(rng);
    for (int64_t t = 0; t < a.seq; ++t) {
      x[static_cast<size_t>(b * a.seq + t)] = c.ids[o + static_cast<size_t>(t)];
      y[static_cast<size_t>(b * a.seq + t)] = c.ids[o + static_cast<size_t>(t) + 1];
    }
  }
  return {from_vector(x, Shape{a.batch, a.seq}), from_vector(y, Shape{a.batch, a.seq})};
}

Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  const int64_t v = logits.size(-1);
  return nn::cross_entropy(reshape(logits, Shape{-1, v}), reshape(targets, Shape{-1}));
}

optim::AdamWOptions adamw(const Args& a) { return {.lr = a.lr, .weight_decay = 0.01}; }

struct Run {
  std::vector<double> losses;
  nn::StateDict final_params;  // on the host
  double seconds = 0;
  double sim_seconds = -1;  // sim pod: simulated time of chip 0's default stream
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One device, the whole global batch, the model's own forward: no sharding code.
Run train_single(const Corpus& c, const Args& a) {
  const auto t0 = std::chrono::steady_clock::now();
  Run r;
  auto model = make_model(a);
  optim::AdamW opt(model->parameters(), adamw(a));
  for (int64_t s = 0; s < a.steps; ++s) {
    auto [x, y] = global_batch(c, a, s);
    opt.zero_grad();
    Tensor loss = lm_loss(model->forward(x), y);
    loss.backward();
    opt.step();
    r.losses.push_back(loss.item<double>());
  }
  r.final_params = model->state_dict();
  r.seconds = since(t0);
  return r;
}

// The model with its decoder layers and then the rest (embedding, final norm) sharded: the
// hooks fully_shard installs gather each layer just before its forward, so the model is called
// as it is.
struct Sharded {
  std::shared_ptr<models::CausalLM> model;
  std::shared_ptr<FSDPModule> root;

  Sharded(std::shared_ptr<models::CausalLM> m, const dist::ProcessGroupPtr& group) : model(std::move(m)) {
    for (auto& l : model->model->layers) nn::parallel::fully_shard(l, group);
    root = nn::parallel::fully_shard(model, group);
  }
  Tensor forward(const Tensor& ids) { return (*model)(ids); }
};

// One rank's FSDP training: its rows of every global batch; returns its local losses.
std::vector<double> train_rank(Sharded& s, const Corpus& c, const Args& a, int rank, int world, Device dev) {
  optim::AdamW opt(s.root->parameters(), adamw(a));
  const int64_t rows = a.batch / world;
  std::vector<double> losses;
  auto train_step = [&](const Tensor& xs, const Tensor& ys) {
    opt.zero_grad();
    Tensor loss = lm_loss(s.forward(xs), ys);
    loss.backward();
    opt.step();
    return loss;
  };
  // --compiled: the whole step (gathers, forward, backward, reduce-scatters, AdamW) is one graph.
  auto compiled_step = compile(train_step, {.name = "fsdp_step_rank" + std::to_string(rank), .fullgraph = true});
  for (int64_t step = 0; step < a.steps; ++step) {
    auto [x, y] = global_batch(c, a, step);
    Tensor xs = narrow(x, 0, rank * rows, rows).contiguous().to(dev);
    Tensor ys = narrow(y, 0, rank * rows, rows).contiguous().to(dev);
    Tensor loss = a.compiled ? compiled_step(xs, ys) : train_step(xs, ys);
    losses.push_back(loss.to(Device()).item<double>());
  }
  return losses;
}

// FSDP over gloo: this process is one rank (tpu-run sets RANK, WORLD_SIZE, MASTER_*).
Run train_gloo(const Corpus& c, const Args& a, int& rank) {
  const auto t0 = std::chrono::steady_clock::now();
  dist::init_process_group();
  rank = dist::get_rank();
  const int world = dist::get_world_size();
  if (a.batch % world != 0) fail("train_gpt_fsdp: --batch {} is not a multiple of {} ranks", a.batch, world);
  dist::DeviceMesh mesh({world}, {"dp"});
  Sharded s(make_model(a), mesh.group("dp"));
  Run r;
  std::vector<double> mine = train_rank(s, c, a, rank, world, Device());
  // Every rank's loss is the mean over its rows; the global batch's loss is their average.
  Tensor l = from_vector(std::vector<float>(mine.begin(), mine.end()), Shape{int64_t(mine.size())});
  dist::all_reduce(l, dist::ReduceOp::avg);
  for (float v : l.to_vector<float>()) r.losses.push_back(v);
  r.final_params = s.root->full_state_dict();
  dist::destroy_process_group();
  r.seconds = since(t0);
  return r;
}

// FSDP on `world` chips of the simulated pod, one thread per rank.
Run train_sim_pod(const Corpus& c, const Args& a) {
  const int world = static_cast<int>(a.sim_pod);
  if (world < 1) fail("train_gpt_fsdp: --sim-pod {} must be at least 1", world);
  if (a.batch % world != 0) fail("train_gpt_fsdp: --batch {} is not a multiple of {} chips", a.batch, world);
  if (a.compute != "host" && a.compute != "chip")
    fail("train_gpt_fsdp: --compute is host or chip, not '{}'", a.compute);
  // The reference trains in f32 on the host: on the chips too, f32 matmuls take f32-accurate
  // products (the chip default, one bf16 pass, would differ from it by ~1e-4 in the loss).
  if (a.compute == "chip") set_float32_matmul_precision(a.chip_precision);
  const auto t0 = std::chrono::steady_clock::now();
  auto groups = dist::sim_pod_groups({world});
  auto sim_now = [] {
    device::sim_device(0).queue().synchronize();
    return device::sim_device(0).queue().stream_time(device::kDefaultStream);
  };
  const double sim0 = sim_now();
  std::vector<std::vector<double>> losses(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  Run r;
  std::vector<std::thread> ts;
  for (int rank = 0; rank < world; ++rank)
    ts.emplace_back([&, rank] {
      try {
        const Device dev = a.compute == "chip" ? Device(DeviceType::sim, rank) : Device();
        auto model = make_model(a);
        model->to(dev);
        Sharded s(model, groups[static_cast<size_t>(rank)]);
        losses[static_cast<size_t>(rank)] = train_rank(s, c, a, rank, world, dev);
        nn::StateDict sd = s.root->full_state_dict();
        if (rank == 0)
          for (auto& [n, t] : sd) r.final_params[n] = t.to(Device());
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int rank = 0; rank < world; ++rank)
    if (!errors[size_t(rank)].empty()) fail("train_gpt_fsdp: rank {} (sim:{}): {}", rank, rank, errors[size_t(rank)]);
  for (int64_t s = 0; s < a.steps; ++s) {
    double avg = 0;
    for (auto& l : losses) avg += l[size_t(s)] / world;
    r.losses.push_back(avg);
  }
  r.sim_seconds = sim_now() - sim0;
  r.seconds = since(t0);
  return r;
}

double max_param_diff(const nn::StateDict& a, const nn::StateDict& b) {
  double m = 0;
  for (auto& [n, t] : a) {
    auto it = b.find(n);
    if (it == b.end()) fail("train_gpt_fsdp: parameter {} missing from the sharded run's state", n);
    m = std::max(m, max(abs(sub(t.to(DType::f32), it->second.to(DType::f32)))).item<double>());
  }
  return m;
}

int report(const Args& a, const std::string& label, const Run& sharded, const Run* single) {
  if (!single) {
    fmt::print("step  {}\n", label);
    for (size_t s = 0; s < sharded.losses.size(); ++s) fmt::print("{:4d}  {:.6f}\n", s + 1, sharded.losses[s]);
    fmt::print("{}: {:.1f} s\n", label, sharded.seconds);
    return 0;
  }
  fmt::print("step  1 device     {:<20}  |difference|\n", label);
  double worst = 0;
  for (size_t s = 0; s < single->losses.size(); ++s) {
    const double d = std::fabs(single->losses[s] - sharded.losses[s]);
    worst = std::max(worst, d);
    fmt::print("{:4d}  {:.6f}   {:<20.6f}  {:.2e}\n", s + 1, single->losses[s], sharded.losses[s], d);
  }
  const double wd = max_param_diff(single->final_params, sharded.final_params);
  fmt::print("max |loss difference| over {} steps: {:.2e}; final weights: max |difference| {:.2e}\n",
             single->losses.size(), worst, wd);
  fmt::print("time: 1 device {:.1f} s, {} {:.1f} s (host wall time)\n", single->seconds, label, sharded.seconds);
  if (sharded.sim_seconds >= 0)
    fmt::print("simulated time of sim:0's stream: {:.3f} ms per step ({})\n", 1e3 * sharded.sim_seconds / a.steps,
               a.compute == "chip" ? "compute and collectives" : "the collectives only: compute ran on the host");
  if (a.tol > 0) {
    if (!(worst <= a.tol)) {
      fmt::print(stderr, "error: the loss curves differ by {:.2e} > --tol {:.2e}\n", worst, a.tol);
      return 1;
    }
    fmt::print("losses agree within {:.1e}\n", a.tol);
  }
  return 0;
}

int run(const Args& a) {
  if (a.steps < 1 || a.batch < 1 || a.seq < 1) fail("train_gpt_fsdp: --steps, --batch and --seq must be positive");
  const bool gloo = std::getenv("WORLD_SIZE") != nullptr;
  if (gloo && a.sim_pod > 0) fail("train_gpt_fsdp: --sim-pod and tpu-run (WORLD_SIZE is set) exclude each other");
  if (a.sim_pod > 0 && !std::getenv("TPU_SIM_POD"))  // before the first sim device exists
    setenv("TPU_SIM_POD", a.sim_pod == 4 ? "2x2" : std::to_string(a.sim_pod).c_str(), 1);
  const Corpus corpus = load_corpus(a);
  if (static_cast<size_t>(a.seq) + 2 > corpus.ids.size())
    fail("train_gpt_fsdp: --seq {} does not fit in the corpus ({} bytes)", a.seq, corpus.ids.size());
  const models::ModelConfig cfg = config_of(a);
  int rank = 0;
  auto header = [&] {
    fmt::print("corpus: {}, {} bytes\n", corpus.source, corpus.ids.size());
    fmt::print("model: byte-level {}-layer GPT (hidden {}, {} query / {} KV heads, SwiGLU {}, tied embeddings), "
               "{} parameters\n",
               cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
               cfg.intermediate_size, make_model(a)->num_parameters());
    fmt::print("global batch {} x {} bytes, {} steps of AdamW (lr {}), seed {}\n", a.batch, a.seq, a.steps, a.lr,
               a.seed);
  };
  std::optional<Run> sharded;
  std::string label;
  if (gloo) {
    sharded = train_gloo(corpus, a, rank);
    label = fmt::format("FSDP {} gloo ranks{}", std::getenv("WORLD_SIZE"), a.compiled ? ", compiled" : "");
    if (rank != 0) return 0;  // rank 0 reports; the reference runs after the job's collectives
  } else if (a.sim_pod > 0) {
    sharded = train_sim_pod(corpus, a);
    label = fmt::format("FSDP {}-chip sim pod{}", a.sim_pod, a.compiled ? ", compiled" : "");
  }
  header();
  if (sharded && a.sim_pod > 0)
    fmt::print("sim pod {} of '{}' chips (TPU_SIM_POD / TPU_SIM_CHIP), compute on {}{}\n", device::sim_pod_shape(),
               device::sim_chip(0), a.compute,
               a.compute == "chip" ? " (f32 matmul precision " + float32_matmul_precision() + ")" : "");
  if (sharded && a.no_reference) return report(a, label, *sharded, nullptr);
  const Run single = train_single(corpus, a);
  if (!sharded) return report(a, "1 device", single, nullptr);
  return report(a, label, *sharded, &single);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  cli::Parser p("train_gpt_fsdp",
                "A small byte-level GPT trained with FSDP (tpu-run -n N over gloo, or --sim-pod N) and on one device.");
  p.value("--sim-pod", "N", "FSDP on N chips of the simulated pod (TPU_SIM_POD, default 2x2 for 4)",
          [&](const std::string& v) { a.sim_pod = p.to_int(v); });
  p.value("--compute", "host|chip", "sim pod: where each rank computes (default host)",
          [&](const std::string& v) { a.compute = v; });
  p.value("--chip-precision", "P", "sim pod on chip: f32 matmul precision (default highest; the chip's own default is one bf16 pass)",
          [&](const std::string& v) { a.chip_precision = v; });
  p.value("--steps", "N", "training steps (default 200)", [&](const std::string& v) { a.steps = p.to_int(v); });
  p.value("--layers", "N", "decoder layers (default 4)", [&](const std::string& v) { a.layers = p.to_int(v); });
  p.value("--hidden", "N", "hidden size (default 96)", [&](const std::string& v) { a.hidden = p.to_int(v); });
  p.value("--inter", "N", "SwiGLU size (default 256)", [&](const std::string& v) { a.inter = p.to_int(v); });
  p.value("--heads", "N", "query heads (default 4)", [&](const std::string& v) { a.heads = p.to_int(v); });
  p.value("--kv-heads", "N", "key/value heads (default 2)", [&](const std::string& v) { a.kv_heads = p.to_int(v); });
  p.value("--batch", "N", "global batch, sequences (default 8)", [&](const std::string& v) { a.batch = p.to_int(v); });
  p.value("--seq", "N", "sequence length (default 64)", [&](const std::string& v) { a.seq = p.to_int(v); });
  p.value("--lr", "X", "AdamW learning rate (default 1e-3)", [&](const std::string& v) { a.lr = p.to_double(v); });
  p.value("--seed", "N", "seed of the model and the batches (default 1)",
          [&](const std::string& v) { a.seed = static_cast<uint64_t>(p.to_int(v)); });
  p.value("--corpus", "DIR", "fortunes folder (default /usr/share/games/fortunes; synthetic text if absent)",
          [&](const std::string& v) { a.corpus = v; });
  p.value("--tol", "X", "fail when the loss curves differ by more than X", [&](const std::string& v) { a.tol = p.to_double(v); });
  p.flag("--compiled", "FSDP runs: the training step through tpu::compile", [&] { a.compiled = true; });
  p.flag("--no-reference", "skip the one-device run", [&] { a.no_reference = true; });
  if (auto rc = p.parse(argc, argv)) return *rc;
  try {
    set_num_threads(1);
    return run(a);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
