// Trains a small byte-level Llama-style model on the Debian `fortunes` corpus on the cpu, saves
// it as a Hugging Face checkpoint (config.json, model.safetensors, tokenizer.json) and then
// loads it like any checkpoint to generate fortunes.
//
//   train_fortunes [--dir DIR] [--seconds S] [--retrain] [--samples N]
//
// DIR (default ./fortunes_model) is reused when it already holds a checkpoint, so only the
// first run trains. The corpus is every text file of /usr/share/games/fortunes (package
// `fortunes`), each fortune followed by the <|endoftext|> token.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tpucore/models.h"
#include "tpucore/nn.h"

namespace fs = std::filesystem;
using namespace tpu;

namespace {

constexpr int64_t kEot = 256;

std::vector<int32_t> read_corpus(const fs::path& dir) {
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

void write_tokenizer(const fs::path& path) {
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

void train(const fs::path& dir, double seconds) {
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
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.01});
  const int64_t B = 16, T = 64;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<size_t> pick(0, ids.size() - static_cast<size_t>(T) - 2);
  const auto t0 = std::chrono::steady_clock::now();
  double ema = 0;
  for (int64_t step = 0;; ++step) {
    std::vector<int32_t> x(static_cast<size_t>(B * T)), y(x.size());
    for (int64_t b = 0; b < B; ++b) {
      const size_t o = pick(rng);
      for (int64_t t = 0; t < T; ++t) {
        x[static_cast<size_t>(b * T + t)] = ids[o + static_cast<size_t>(t)];
        y[static_cast<size_t>(b * T + t)] = ids[o + static_cast<size_t>(t) + 1];
      }
    }
    opt.zero_grad();
    Tensor logits = model.forward(from_vector(x, Shape{B, T}));
    Tensor loss = nn::cross_entropy(reshape(logits, Shape{B * T, c.vocab_size}), from_vector(y, Shape{B * T}));
    loss.backward();
    opt.step();
    const double l = loss.item<double>();
    ema = step == 0 ? l : 0.95 * ema + 0.05 * l;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step % 20 == 0) {
      fmt::print("step {:5d}  loss {:.3f}  ({:.0f} s)\n", step, ema, elapsed);
      std::fflush(stdout);
    }
    if (elapsed > seconds) {
      fmt::print("trained {} steps of {} x {} bytes in {:.0f} s, loss {:.3f}\n", step + 1, B, T, elapsed, ema);
      break;
    }
  }
  models::save_causal_lm(model, dir.string());
  write_tokenizer(dir / "tokenizer.json");
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = "fortunes_model";
  double seconds = 180;
  int samples = 4;
  bool retrain = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--seconds" && i + 1 < argc) seconds = std::stod(argv[++i]);
    else if (a == "--samples" && i + 1 < argc) samples = std::stoi(argv[++i]);
    else if (a == "--retrain") retrain = true;
    else {
      fmt::print(stderr, "usage: train_fortunes [--dir DIR] [--seconds S] [--retrain] [--samples N]\n");
      return 2;
    }
  }
  try {
    if (retrain || !fs::exists(dir / "model.safetensors")) train(dir, seconds);
    else fmt::print("using the checkpoint in {}\n", dir.string());
    // Load it back like any Hugging Face checkpoint.
    auto model = models::load_causal_lm(dir.string());
    Tokenizer tok = Tokenizer::from_file((dir / "tokenizer.json").string());
    models::GenerationConfig g;
    g.max_new_tokens = 200;
    g.do_sample = true;
    g.temperature = 0.8;
    g.top_k = 40;
    g.stop_tokens = {kEot};
    g.compile = true;
    for (int s = 0; s < samples; ++s) {
      g.seed = static_cast<uint64_t>(s + 1);
      fmt::print("--- sample {}\n", s + 1);
      models::generate(*model, {{kEot}}, g, [&](size_t, int64_t t) {
        if (t != kEot) fmt::print("{}", tok.decode({t}));
        std::fflush(stdout);
        return true;
      });
      fmt::print("\n");
    }
  } catch (const Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
