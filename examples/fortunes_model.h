// The fortunes model of the examples: reads the Debian `fortunes` corpus (every text file of
// /usr/share/games/fortunes, each fortune followed by the <|endoftext|> token 256), trains a
// small byte-level Llama-style model on it on the cpu and saves it as a Hugging Face checkpoint
// (config.json, model.safetensors, tokenizer.json). Shared by train_fortunes and main_example.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/core/parallel.h"
#include "tpucore/models.h"
#include "tpucore/nn.h"
#include "tpucore/optim.h"

namespace fortunes {

namespace fs = std::filesystem;
using namespace tpu;

constexpr int64_t kEot = 256;
constexpr int64_t kVocab = 257;

// The corpus as token ids: the bytes of every fortune, each followed by kEot (in file order).
// `keep(i)` selects the fortunes by their index i (counted from 1) in that order.
template <class Keep>
std::vector<int32_t> read_fortunes(const fs::path& dir, Keep keep) {
  std::vector<int32_t> ids;
  std::vector<fs::path> files;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && !e.path().has_extension()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  int64_t n = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string line, cur;
    while (std::getline(in, line)) {
      if (line != "%") {
        cur += line + "\n";
        continue;
      }
      if (!cur.empty() && keep(++n)) {
        for (unsigned char ch : cur) ids.push_back(ch);
        ids.push_back(static_cast<int32_t>(kEot));
      }
      cur.clear();
    }
  }
  return ids;
}
inline std::vector<int32_t> read_corpus(const fs::path& dir) {
  return read_fortunes(dir, [](int64_t) { return true; });
}

// The corpus split by fortune: every `val_every`-th fortune is held out for validation.
struct Corpus {
  std::vector<int32_t> train, val;
};
inline Corpus read_split(const fs::path& dir = "/usr/share/games/fortunes", int64_t val_every = 20) {
  Corpus c{read_fortunes(dir, [&](int64_t i) { return i % val_every != 0; }),
           read_fortunes(dir, [&](int64_t i) { return i % val_every == 0; })};
  TPU_CHECK(c.train.size() > 10000 && c.val.size() > 1000,
            "fortunes: the corpus in {} is missing or too small ({} bytes); install the Debian package 'fortunes'",
            dir.string(), c.train.size() + c.val.size());
  return c;
}

// The independent baseline: bits per symbol of `val` under the unigram distribution of `train`
// (symbol counts, add-one smoothed), by a plain count. A model that has learnt anything about
// the order of bytes must beat it.
inline double unigram_bits(const std::vector<int32_t>& train, const std::vector<int32_t>& val) {
  std::vector<double> count(static_cast<size_t>(kVocab), 1.0);
  for (int32_t t : train) count[static_cast<size_t>(t)] += 1;
  const double total = static_cast<double>(train.size()) + static_cast<double>(kVocab);
  double bits = 0;
  for (int32_t t : val) bits -= std::log2(count[static_cast<size_t>(t)] / total);
  return bits / static_cast<double>(val.size());
}

inline void write_tokenizer(const fs::path& path) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(static_cast<uint8_t>(b))] = b;
  nlohmann::json j{{"version", "1.0"},
                   {"added_tokens", {{{"id", kEot}, {"content", "<|endoftext|>"}, {"special", true}}}},
                   {"normalizer", nullptr},
                   {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                   {"decoder", {{"type", "ByteLevel"}}},
                   {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  std::ofstream(path) << j.dump();
}

// The training recipe's version: a cached checkpoint written by another recipe is retrained
// (is_current), so changing the default Recipe below must bump it.
constexpr int kRecipeVersion = 4;
inline fs::path recipe_file(const fs::path& dir) { return dir / "fortunes_recipe.txt"; }
inline bool is_current(const fs::path& dir) {
  std::ifstream in(recipe_file(dir));
  int v = 0;
  return fs::exists(dir / "model.safetensors") && (in >> v) && v == kRecipeVersion;
}

// Sampling defaults of the examples: a byte-level model this small writes the most fortune-like
// text a little colder than its own distribution, without its unlikely tail.
inline models::GenerationConfig sampling() {
  models::GenerationConfig g;
  g.do_sample = true;
  g.temperature = 0.7;
  g.top_p = 0.9;
  g.repetition_penalty = 1.0;
  g.stop_tokens = {kEot};
  return g;
}

// The model shape and the training schedule. The learning rate is warmup-stable-decay over wall
// time (the step count a loaded host manages is not known beforehand): linear warmup over the
// first `warmup` of the time, the peak held, then a linear decay to `final_frac` of the peak
// over the last `decay` of it. max_steps > 0 ends training after that many steps instead, and
// cpu_seconds > 0 after that much process cpu time (both then drive the schedule: for comparing
// recipes at equal compute on a host whose load changes).
//
// Recipe 4 (the defaults): 2 layers, hidden 96, MLP 256, 4 query heads sharing 2 KV heads
// (0.23M parameters), batches of 8 x 128 bytes, peak 4e-3, the step compiled. Compared on one thread at an equal budget of 60 s
// of cpu time (what a 3-minute run gets on the shared 2-core host), held-out bits per byte:
// recipe 3's shape (3 layers, hidden 128, GQA 4/2, 16 x 64 bytes) 2.93; 2 layers of it 2.83;
// 2 layers with 8 x 128 bytes 2.84 (peak 8e-3: 3.00); hidden 96 with 3 heads 2.76 (peak 6e-3:
// 2.82; 3 layers: 2.82), with 4 query / 2 KV heads 2.74; hidden 64, peak 6e-3 2.72. In a few
// minutes of this cpu the number of steps wins over the size; hidden 96 keeps some room for a
// faster host, and grouped KV heads (as Llama 3) let decode on the chip use its grouped decode
// attention kernel. A context of 128 (it was 64)
// covers most of a fortune, and the checkpoint's max_position_embeddings says so: sampling past
// the trained positions gave noise.
struct Recipe {
  int64_t layers = 2, hidden = 96, inter = 256, heads = 4, kv_heads = 2;
  int64_t batch = 8, ctx = 128;
  double peak_lr = 4e-3, final_frac = 0.1, warmup = 0.03, decay = 0.3, weight_decay = 0.05;
  double seconds = 170;
  int64_t max_steps = 0;
  double cpu_seconds = 0;
  int threads = 0;  // cpu threads of the steps; 0: the faster of one and all, timed (ThreadChooser)
  bool compiled = true;  // the whole step (forward, backward, AdamW) through tpu::compile
  int64_t eval_bytes = 32768;  // validation symbols scored after training (0: all)
};

struct TrainResult {
  int64_t steps = 0, one_thread_steps = 0;
  double seconds = 0, cpu_seconds = 0, first_step_seconds = 0, train_loss = 0, val_bits = 0, unigram_bits = 0;
};

// The validation symbols evaluate() scores: val[1 .. n] for the returned n (whole windows).
inline int64_t scored_symbols(const std::vector<int32_t>& val, int64_t ctx, int64_t max_symbols) {
  const int64_t avail = static_cast<int64_t>(val.size()) - 1;
  return std::max<int64_t>(1, (max_symbols > 0 ? std::min(max_symbols, avail) : avail) / ctx) * ctx;
}

// Bits per symbol (byte or end of fortune) of the model on the first symbols of `val`
// (scored_symbols): non-overlapping windows of `ctx` symbols, every position scored given the
// window before it.
inline double evaluate(models::CausalLM& model, const std::vector<int32_t>& val, int64_t ctx, int64_t max_symbols) {
  NoGradGuard ng;
  const int64_t windows = scored_symbols(val, ctx, max_symbols) / ctx;
  const int64_t per_batch = 16;
  double nats = 0;
  for (int64_t w0 = 0; w0 < windows; w0 += per_batch) {
    const int64_t n = std::min(per_batch, windows - w0);
    std::vector<int32_t> x(static_cast<size_t>(n * ctx)), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = val[static_cast<size_t>(w0 * ctx) + i];
      y[i] = val[static_cast<size_t>(w0 * ctx) + i + 1];
    }
    Tensor logits = model.forward(from_vector(x, Shape{n, ctx}));
    Tensor loss = nn::cross_entropy(reshape(logits, Shape{n * ctx, kVocab}), from_vector(y, Shape{n * ctx}));
    nats += loss.item<double>() * static_cast<double>(n * ctx);
  }
  return nats / static_cast<double>(windows * ctx) / std::log(2.0);
}

// Picks the thread count of the training steps by timing: the cpu thread pool's fork and join
// per op pays off on an idle host but loses badly when other processes hold the cores (a
// worker descheduled mid-op stalls the step). Every kPeriod steps it times kProbe steps on all
// threads and kProbe on one, then keeps the faster until the next probe.
struct ThreadChooser {
  static constexpr int64_t kPeriod = 200, kProbe = 6;
  explicit ThreadChooser(int fixed) : hw(fixed > 0 ? 1 : num_threads()) {
    if (fixed > 0) set_num_threads(fixed);
  }
  const int hw;
  double t_all = 0, t_one = 0;
  int chosen = hw;
  int64_t one_thread_steps = 0;
  void before(int64_t step) {
    if (hw <= 1) return;
    const int64_t p = (step - 1) % kPeriod;  // step 0 (the compile) is not timed
    if (step == 0 || p >= 2 * kProbe) set_num_threads(step == 0 ? hw : chosen);
    else set_num_threads(p < kProbe ? hw : 1);
    if (num_threads() == 1) ++one_thread_steps;
  }
  void after(int64_t step, double seconds) {
    if (hw <= 1 || step == 0) return;
    const int64_t p = (step - 1) % kPeriod;
    if (p == 0) t_all = t_one = 0;
    if (p < kProbe) t_all += seconds;
    else if (p < 2 * kProbe) t_one += seconds;
    if (p == 2 * kProbe - 1) chosen = t_one < t_all ? 1 : hw;
  }
};

inline models::ModelConfig model_config(const Recipe& r) {
  models::ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = kVocab;
  c.hidden_size = r.hidden;
  c.intermediate_size = r.inter;
  c.num_hidden_layers = r.layers;
  c.num_attention_heads = r.heads;
  c.num_key_value_heads = r.kv_heads;
  c.max_position_embeddings = r.ctx;  // the context it was trained on: positions past it were never seen
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.bos_token_id = kEot;
  c.eos_token_ids = {kEot};
  return c;
}

// Trains for about `r.seconds` of wall time (or r.max_steps steps), reports the validation bits
// per symbol and saves the checkpoint in `dir`.
inline TrainResult train(const fs::path& dir, const Recipe& r, const Corpus& corpus) {
  TPU_CHECK(r.batch > 0 && r.ctx > 1 && r.ctx <= 4096 && r.seconds > 0 && r.max_steps >= 0 && r.cpu_seconds >= 0 &&
                r.threads >= 0 && r.peak_lr > 0,
            "fortunes: bad recipe (batch {}, context {}, {} s, {} steps, {} cpu s, {} threads, peak lr {}): the batch, "
            "time and learning rate must be positive, the context 2-4096, the rest not negative",
            r.batch, r.ctx, r.seconds, r.max_steps, r.cpu_seconds, r.threads, r.peak_lr);
  const std::vector<int32_t>& ids = corpus.train;
  fmt::print("corpus: {} training and {} held-out validation symbols (bytes and end-of-fortune marks; every 20th "
             "fortune held out)\n",
             ids.size(), corpus.val.size());
  const models::ModelConfig c = model_config(r);
  Generator gen(1234);
  models::CausalLM model(c, &gen);
  {  // GPT-style small init of the tied embedding (N(0, 1) would make the first logits huge)
    NoGradGuard ng;
    mul_(model.model->embed_tokens->weight, full({}, 0.02));
  }
  fmt::print("model: {} parameters ({} layers, hidden {}, MLP {}, {}/{} heads), batches of {} x {} bytes{}\n",
             model.num_parameters(), r.layers, r.hidden, r.inter, r.heads, r.kv_heads, r.batch, r.ctx,
             r.compiled ? ", compiled step" : "");
  optim::AdamW opt(model.parameters(), {.lr = r.peak_lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = r.weight_decay});
  const int64_t B = r.batch, T = r.ctx;
  auto step_fn = [&](const Tensor& x, const Tensor& y, double lr) {
    opt.set_lr(lr);
    opt.zero_grad();
    Tensor logits = model.forward(x);
    Tensor loss = nn::cross_entropy(reshape(logits, Shape{B * T, kVocab}), reshape(y, Shape{B * T}));
    loss.backward();
    opt.step();
    return loss;
  };
  auto compiled_step = compile(step_fn, {.name = "fortunes_train_step", .fullgraph = true});
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<size_t> pick(0, ids.size() - static_cast<size_t>(T) - 2);
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  TrainResult res;
  double ema = 0, elapsed = 0, cpu = 0;
  const int threads_before = num_threads();
  ThreadChooser threads(r.threads);
  for (int64_t step = 0;; ++step) {
    const double f = r.max_steps > 0     ? static_cast<double>(step) / static_cast<double>(r.max_steps)
                     : r.cpu_seconds > 0 ? std::min(1.0, cpu / r.cpu_seconds)
                                         : std::min(1.0, elapsed / r.seconds);
    const double lr = f < r.warmup         ? r.peak_lr * std::max(0.05, f / r.warmup)
                      : f < 1.0 - r.decay ? r.peak_lr
                                          : r.peak_lr * (1.0 - (1.0 - r.final_frac) * (f - (1.0 - r.decay)) / r.decay);
    std::vector<int32_t> x(static_cast<size_t>(B * T)), y(x.size());
    for (int64_t b = 0; b < B; ++b) {
      const size_t o = pick(rng);
      for (int64_t t = 0; t < T; ++t) {
        x[static_cast<size_t>(b * T + t)] = ids[o + static_cast<size_t>(t)];
        y[static_cast<size_t>(b * T + t)] = ids[o + static_cast<size_t>(t) + 1];
      }
    }
    const Tensor xs = from_vector(x, Shape{B, T}), ys = from_vector(y, Shape{B, T});
    threads.before(step);
    const Tensor loss = r.compiled ? compiled_step(xs, ys, lr) : step_fn(xs, ys, lr);
    const double l = loss.item<double>();
    ema = step == 0 ? l : 0.95 * ema + 0.05 * l;
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    threads.after(step, now - elapsed);
    elapsed = now;
    cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    if (step == 0) res.first_step_seconds = elapsed;
    if (step % 50 == 0) {
      fmt::print("step {:5d}  loss {:.3f}  lr {:.2e}  ({:.0f} s)\n", step, ema, lr, elapsed);
      std::fflush(stdout);
    }
    if (r.max_steps > 0 ? step + 1 >= r.max_steps : r.cpu_seconds > 0 ? cpu > r.cpu_seconds : elapsed > r.seconds) {
      res.steps = step + 1;
      break;
    }
  }
  res.seconds = elapsed;
  res.cpu_seconds = cpu;
  res.one_thread_steps = threads.one_thread_steps;
  set_num_threads(threads_before);
  res.train_loss = ema;
  res.val_bits = evaluate(model, corpus.val, T, r.eval_bytes);
  const int64_t scored = scored_symbols(corpus.val, T, r.eval_bytes);
  res.unigram_bits = unigram_bits(ids, std::vector<int32_t>(corpus.val.begin() + 1, corpus.val.begin() + 1 + scored));
  fmt::print("trained {} steps of {} x {} bytes in {:.1f} s ({:.2f} steps/s; first step {:.2f} s; process cpu time "
             "{:.1f} s), training loss {:.3f} nats\n",
             res.steps, B, T, res.seconds, static_cast<double>(res.steps) / res.seconds, res.first_step_seconds,
             res.cpu_seconds, res.train_loss);
  if (threads.hw > 1)
    fmt::print("threads: {} of the steps ran on 1 thread, the rest on {} (the faster of the two, timed every {} steps)\n",
               res.one_thread_steps, threads.hw, ThreadChooser::kPeriod);
  fmt::print("validation: {:.3f} bits per byte on {} held-out symbols (unigram baseline {:.3f})\n", res.val_bits,
             scored, res.unigram_bits);
  fs::create_directories(dir);
  models::save_causal_lm(model, dir.string());
  write_tokenizer(dir / "tokenizer.json");
  std::ofstream(recipe_file(dir)) << kRecipeVersion << "\n";
  return res;
}

inline TrainResult train(const fs::path& dir, double seconds) {
  Recipe r;
  r.seconds = seconds;
  return train(dir, r, read_split());
}

}  // namespace fortunes
