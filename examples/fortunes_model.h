// The fortunes model of the examples: reads the Debian `fortunes` corpus (every text file of
// /usr/share/games/fortunes, each fortune followed by the <|endoftext|> token 256), trains a
// small byte-level Llama-style model on it on the cpu and saves it as a Hugging Face checkpoint
// (config.json, model.safetensors, tokenizer.json). Shared by train_fortunes and main_example.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "tpucore/models.h"
#include "tpucore/nn.h"
#include "tpucore/optim.h"

namespace fortunes {

namespace fs = std::filesystem;
using namespace tpu;


constexpr int64_t kEot = 256;

inline std::vector<int32_t> read_corpus(const fs::path& dir) {
  std::vector<int32_t> ids;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && !e.path().has_extension()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string line, cur;
    while (std::getline(in, line)) {
      if (line == "%") {
        for (unsigned char c : cur) ids.push_back(c);
        if (!cur.empty()) ids.push_back(static_cast<int32_t>(kEot));
        cur.clear();
      } else {
        cur += line + "\n";
      }
    }
  }
  return ids;
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
// (is_current), so changing the recipe below must bump it.
constexpr int kRecipeVersion = 3;
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

// Trains for about `seconds` of wall time and saves the checkpoint in `dir`. Recipe 3: batches
// of 16 sequences of 64 bytes (the cpu here manages a few thousand bytes/s, so a run sees well
// under one epoch), AdamW with betas (0.9, 0.95), the learning rate warmup-stable-decay: a
// linear warmup over the first 3% of the time, the peak 4e-3 held, then a linear decay to a
// tenth of it over the last 25% (recipe 2, a cosine decay from the start with peak 5e-3, ended
// at a loss of 2.53 after 327 steps: likely too low a rate while the model still learned fast).
// The schedule follows wall time (the step count is not known beforehand).
inline void train(const fs::path& dir, double seconds) {
  const std::vector<int32_t> ids = read_corpus("/usr/share/games/fortunes");
  TPU_CHECK(ids.size() > 10000, "train_fortunes: the corpus is missing; install the Debian package 'fortunes'");
  fmt::print("corpus: {} bytes of fortunes\n", ids.size());
  models::ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 257;
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.bos_token_id = kEot;
  c.eos_token_ids = {kEot};
  Generator gen(1234);
  models::CausalLM model(c, &gen);
  {  // GPT-style small init of the tied embedding (N(0, 1) would make the first logits huge)
    NoGradGuard ng;
    mul_(model.model->embed_tokens->weight, full({}, 0.02));
  }
  fmt::print("model: {} parameters\n", model.num_parameters());
  const double peak = 4e-3;
  optim::AdamW opt(model.parameters(), {.lr = peak, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.05});
  const int64_t B = 16, T = 64;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<size_t> pick(0, ids.size() - static_cast<size_t>(T) - 2);
  const auto t0 = std::chrono::steady_clock::now();
  double ema = 0, elapsed = 0;
  for (int64_t step = 0;; ++step) {
    const double f = std::min(1.0, elapsed / seconds);
    const double lr = f < 0.03   ? peak * std::max(0.05, f / 0.03)
                      : f < 0.75 ? peak
                                 : peak * (1.0 - 0.9 * (f - 0.75) / 0.25);
    std::vector<int32_t> x(static_cast<size_t>(B * T)), y(x.size());
    for (int64_t b = 0; b < B; ++b) {
      const size_t o = pick(rng);
      for (int64_t t = 0; t < T; ++t) {
        x[static_cast<size_t>(b * T + t)] = ids[o + static_cast<size_t>(t)];
        y[static_cast<size_t>(b * T + t)] = ids[o + static_cast<size_t>(t) + 1];
      }
    }
    opt.set_lr(lr);
    opt.zero_grad();
    Tensor logits = model.forward(from_vector(x, Shape{B, T}));
    Tensor loss = nn::cross_entropy(reshape(logits, Shape{B * T, c.vocab_size}), from_vector(y, Shape{B * T}));
    loss.backward();
    opt.step();
    const double l = loss.item<double>();
    ema = step == 0 ? l : 0.95 * ema + 0.05 * l;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step % 20 == 0) {
      fmt::print("step {:5d}  loss {:.3f}  lr {:.2e}  ({:.0f} s)\n", step, ema, lr, elapsed);
      std::fflush(stdout);
    }
    if (elapsed > seconds) {
      fmt::print("trained {} steps of {} x {} bytes in {:.0f} s, loss {:.3f}\n", step + 1, B, T, elapsed, ema);
      break;
    }
  }
  models::save_causal_lm(model, dir.string());
  write_tokenizer(dir / "tokenizer.json");
  std::ofstream(recipe_file(dir)) << kRecipeVersion << "\n";
}


}  // namespace fortunes
