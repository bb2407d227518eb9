// The fortunes model of the examples: reads the Debian `fortunes` corpus (every text file of
// /usr/share/games/fortunes, each fortune followed by the <|endoftext|> token 256), learns a
// byte-level BPE vocabulary on the training fortunes (tpu::train_bpe_tokenizer, GPT-2's split),
// trains a small Llama-style model on the tokens on the cpu and saves it as a Hugging Face
// checkpoint (config.json, model.safetensors, tokenizer.json). Shared by train_fortunes and
// main_example.
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
constexpr int64_t kByteVocab = 257;  // the bytes and kEot: the symbols bits per byte are counted on

// The text of every fortune, in file order. `keep(i)` selects the fortunes by their index i
// (counted from 1) in that order.
template <class Keep>
std::vector<std::string> read_fortune_texts(const fs::path& dir, Keep keep) {
  std::vector<std::string> texts;
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
      if (!cur.empty() && keep(++n)) texts.push_back(cur);
      cur.clear();
    }
  }
  return texts;
}
// The whole corpus as byte ids, each fortune followed by kEot (the byte-level GPT of train_gpt_fsdp).
inline std::vector<int32_t> read_corpus(const fs::path& dir) {
  std::vector<int32_t> ids;
  for (const std::string& t : read_fortune_texts(dir, [](int64_t) { return true; })) {
    for (unsigned char ch : t) ids.push_back(ch);
    ids.push_back(static_cast<int32_t>(kEot));
  }
  return ids;
}

// The corpus split by fortune (every `val_every`-th fortune held out for validation) as token
// ids of a BPE vocabulary of `vocab` ids learnt on the training fortunes (257: bytes only), each
// fortune followed by kEot. The bytes behind them are kept for bits per byte.
struct Corpus {
  std::string tokenizer_json;
  int64_t vocab = kByteVocab;
  std::vector<int32_t> train, val;            // token ids
  std::vector<int32_t> train_bytes, val_bytes;  // the same text as bytes and kEot marks
  std::vector<int64_t> token_bytes;           // symbols (bytes; 1 for kEot) of each token id
};
inline Corpus read_split(const fs::path& dir = "/usr/share/games/fortunes", int64_t val_every = 20,
                         int64_t vocab = 2048) {
  const auto train_texts = read_fortune_texts(dir, [&](int64_t i) { return i % val_every != 0; });
  const auto val_texts = read_fortune_texts(dir, [&](int64_t i) { return i % val_every == 0; });
  size_t bytes = 0;
  for (const auto* v : {&train_texts, &val_texts})
    for (const auto& t : *v) bytes += t.size() + 1;
  TPU_CHECK(train_texts.size() > 100 && val_texts.size() > 5 && bytes > 11000,
            "fortunes: the corpus in {} is missing or too small ({} bytes); install the Debian package 'fortunes'",
            dir.string(), bytes);
  Corpus c;
  BpeTrainOptions o;
  o.vocab_size = vocab;
  o.special_tokens = {"<|endoftext|>"};  // id 256 = kEot
  c.tokenizer_json = train_bpe_tokenizer(vocab > kByteVocab ? train_texts : std::vector<std::string>{}, o);
  const Tokenizer tok = Tokenizer::from_json(c.tokenizer_json, "fortunes tokenizer");
  c.vocab = tok.vocab_size();
  TPU_CHECK(tok.token_to_id("<|endoftext|>") == kEot, "fortunes: <|endoftext|> is not id {}", kEot);
  for (int64_t id = 0; id < c.vocab; ++id) c.token_bytes.push_back(id == kEot ? 1 : static_cast<int64_t>(tok.decode({id}).size()));
  auto fill = [&](const std::vector<std::string>& texts, std::vector<int32_t>& ids, std::vector<int32_t>& raw) {
    for (const std::string& t : texts) {
      for (int64_t id : tok.encode(t, /*allow_special=*/false)) ids.push_back(static_cast<int32_t>(id));
      ids.push_back(static_cast<int32_t>(kEot));
      for (unsigned char ch : t) raw.push_back(ch);
      raw.push_back(static_cast<int32_t>(kEot));
    }
  };
  fill(train_texts, c.train, c.train_bytes);
  fill(val_texts, c.val, c.val_bytes);
  return c;
}

// The independent baseline: bits per symbol of `val` under the unigram distribution of `train`
// over `vocab` symbols (counts, add-one smoothed), by a plain count. Over tokens it is divided
// by the bytes they stand for (`per_byte`, the symbols behind val); a model that has learnt
// anything about the order of tokens must beat it.
inline double unigram_bits(const std::vector<int32_t>& train, const std::vector<int32_t>& val, int64_t vocab,
                           double per_byte = 0) {
  std::vector<double> count(static_cast<size_t>(vocab), 1.0);
  for (int32_t t : train) count[static_cast<size_t>(t)] += 1;
  const double total = static_cast<double>(train.size()) + static_cast<double>(vocab);
  double bits = 0;
  for (int32_t t : val) bits -= std::log2(count[static_cast<size_t>(t)] / total);
  return bits / (per_byte > 0 ? per_byte : static_cast<double>(val.size()));
}

// The training recipe's version: a cached checkpoint written by another recipe is retrained
// (is_current), so changing the default Recipe below must bump it.
constexpr int kRecipeVersion = 5;
inline fs::path recipe_file(const fs::path& dir) { return dir / "fortunes_recipe.txt"; }
inline bool is_current(const fs::path& dir) {
  std::ifstream in(recipe_file(dir));
  int v = 0;
  return fs::exists(dir / "model.safetensors") && (in >> v) && v == kRecipeVersion;
}

// Sampling defaults of the examples: a model this small writes the most fortune-like
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
// Recipe 5 (the defaults): a BPE vocabulary of 2048 learnt on the training fortunes (2.65
// bytes per token), 3 layers, hidden 128, MLP 384, 4 query heads sharing 2 KV heads (0.85M
// parameters), batches of 16 x 128 tokens (a context of ~340 bytes: whole fortunes), peak 4e-3,
// the step compiled. In 170 s on an idle 2-core Intel Xeon (AVX-512), held-out bits per byte:
// recipe 4 (bytes, 2 layers, hidden 96, 8 x 128 bytes) 2.6-2.8 before; its shape on a BPE
// vocabulary of 1024, 90 s: 2.37; this recipe 2.25 (1271 steps); with a vocabulary of 4096
// 2.26 (1014 steps). Tokens of several bytes let the same steps see ~2.6x more text and the
// samples are made of whole words; grouped KV heads (as Llama 3) let decode on the chip use its
// grouped decode attention kernel. The checkpoint's max_position_embeddings is the trained
// context: sampling past the trained positions gave noise.
struct Recipe {
  int64_t vocab = 2048;  // BPE vocabulary learnt on the training fortunes (257: bytes only)
  int64_t layers = 3, hidden = 128, inter = 384, heads = 4, kv_heads = 2;
  int64_t batch = 16, ctx = 128;
  double peak_lr = 4e-3, final_frac = 0.1, warmup = 0.03, decay = 0.3, weight_decay = 0.05;
  double seconds = 170;
  int64_t max_steps = 0;
  double cpu_seconds = 0;
  int threads = 0;  // cpu threads of the steps; 0: the faster of one and all, timed (ThreadChooser)
  bool compiled = true;  // the whole step (forward, backward, AdamW) through tpu::compile
  int64_t eval_tokens = 16384;  // validation tokens scored after training (0: all)
};

struct TrainResult {
  int64_t steps = 0, one_thread_steps = 0;
  double seconds = 0, cpu_seconds = 0, first_step_seconds = 0, train_loss = 0, val_bits = 0, unigram_bits = 0,
         byte_unigram_bits = 0;
};

// The validation symbols evaluate() scores: val[1 .. n] for the returned n (whole windows).
inline int64_t scored_symbols(const std::vector<int32_t>& val, int64_t ctx, int64_t max_symbols) {
  const int64_t avail = static_cast<int64_t>(val.size()) - 1;
  return std::max<int64_t>(1, (max_symbols > 0 ? std::min(max_symbols, avail) : avail) / ctx) * ctx;
}

// The bytes (and end-of-fortune marks) the tokens val[1 .. n] stand for.
inline double bytes_of(const std::vector<int32_t>& val, int64_t n, const std::vector<int64_t>& token_bytes) {
  double bytes = 0;
  for (int64_t i = 1; i <= n; ++i) bytes += static_cast<double>(token_bytes[static_cast<size_t>(val[static_cast<size_t>(i)])]);
  return bytes;
}

// Bits per byte (per symbol: byte or end of fortune) of the model on the first tokens of `val`
// (scored_symbols): non-overlapping windows of `ctx` tokens, every position scored given the
// window before it; the nats of all scored tokens over the bytes they stand for.
inline double evaluate(models::CausalLM& model, const std::vector<int32_t>& val, int64_t ctx, int64_t max_symbols,
                       const std::vector<int64_t>& token_bytes) {
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
    Tensor loss = nn::cross_entropy(reshape(logits, Shape{n * ctx, model.config.vocab_size}), from_vector(y, Shape{n * ctx}));
    nats += loss.item<double>() * static_cast<double>(n * ctx);
  }
  return nats / bytes_of(val, windows * ctx, token_bytes) / std::log(2.0);
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

inline models::ModelConfig model_config(const Recipe& r, int64_t vocab) {
  models::ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = vocab;
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
  fmt::print("corpus: {} training and {} held-out validation tokens ({} and {} bytes and end-of-fortune marks; every "
             "20th fortune held out; a BPE vocabulary of {} learnt on the training fortunes)\n",
             ids.size(), corpus.val.size(), corpus.train_bytes.size(), corpus.val_bytes.size(), corpus.vocab);
  const models::ModelConfig c = model_config(r, corpus.vocab);
  Generator gen(1234);
  models::CausalLM model(c, &gen);
  {  // GPT-style small init of the tied embedding (N(0, 1) would make the first logits huge)
    NoGradGuard ng;
    mul_(model.model->embed_tokens->weight, full({}, 0.02));
  }
  fmt::print("model: {} parameters ({} layers, hidden {}, MLP {}, {}/{} heads), batches of {} x {} tokens{}\n",
             model.num_parameters(), r.layers, r.hidden, r.inter, r.heads, r.kv_heads, r.batch, r.ctx,
             r.compiled ? ", compiled step" : "");
  optim::AdamW opt(model.parameters(), {.lr = r.peak_lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = r.weight_decay});
  const int64_t B = r.batch, T = r.ctx;
  auto step_fn = [&](const Tensor& x, const Tensor& y, double lr) {
    opt.set_lr(lr);
    opt.zero_grad();
    Tensor logits = model.forward(x);
    Tensor loss = nn::cross_entropy(reshape(logits, Shape{B * T, c.vocab_size}), reshape(y, Shape{B * T}));
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
  res.val_bits = evaluate(model, corpus.val, T, r.eval_tokens, corpus.token_bytes);
  const int64_t scored = scored_symbols(corpus.val, T, r.eval_tokens);
  const double scored_bytes = bytes_of(corpus.val, scored, corpus.token_bytes);
  res.unigram_bits = unigram_bits(ids, std::vector<int32_t>(corpus.val.begin() + 1, corpus.val.begin() + 1 + scored),
                                  corpus.vocab, scored_bytes);
  {  // the byte-level unigram of the same held-out bytes, for comparison with byte-level models
    const auto first = static_cast<size_t>(corpus.token_bytes[static_cast<size_t>(corpus.val[0])]);
    res.byte_unigram_bits = unigram_bits(corpus.train_bytes,
                                         std::vector<int32_t>(corpus.val_bytes.begin() + static_cast<ptrdiff_t>(first),
                                                              corpus.val_bytes.begin() + static_cast<ptrdiff_t>(first) +
                                                                  static_cast<ptrdiff_t>(scored_bytes)),
                                         kByteVocab);
  }
  fmt::print("trained {} steps of {} x {} tokens in {:.1f} s ({:.2f} steps/s; first step {:.2f} s; process cpu time "
             "{:.1f} s), training loss {:.3f} nats\n",
             res.steps, B, T, res.seconds, static_cast<double>(res.steps) / res.seconds, res.first_step_seconds,
             res.cpu_seconds, res.train_loss);
  if (threads.hw > 1)
    fmt::print("threads: {} of the steps ran on 1 thread, the rest on {} (the faster of the two, timed every {} steps)\n",
               res.one_thread_steps, threads.hw, ThreadChooser::kPeriod);
  fmt::print("validation: {:.3f} bits per byte on {} held-out tokens ({:.0f} bytes; unigram baseline over the same "
             "tokens {:.3f}, over the bytes {:.3f})\n",
             res.val_bits, scored, scored_bytes, res.unigram_bits, res.byte_unigram_bits);
  fs::create_directories(dir);
  models::save_causal_lm(model, dir.string());
  std::ofstream(dir / "tokenizer.json") << corpus.tokenizer_json;
  std::ofstream(recipe_file(dir)) << kRecipeVersion << "\n";
  return res;
}

inline TrainResult train(const fs::path& dir, double seconds) {
  Recipe r;
  r.seconds = seconds;
  return train(dir, r, read_split("/usr/share/games/fortunes", 20, r.vocab));
}

}  // namespace fortunes
