// Trains a small byte-level Llama-style model on the Debian `fortunes` corpus on the cpu, saves
// it as a Hugging Face checkpoint (config.json, model.safetensors, tokenizer.json) and then
// loads it like any checkpoint to generate fortunes.
//
//   train_fortunes [--dir DIR] [--seconds S] [--retrain] [--samples N]
//
// DIR (default ./fortunes_model) is reused when it already holds a checkpoint of the current
// training recipe (fortunes_recipe.txt), so only the first run trains. The corpus is every text file of /usr/share/games/fortunes (package
// `fortunes`), each fortune followed by the <|endoftext|> token.
#include "fortunes_model.h"

namespace fs = std::filesystem;
using namespace tpu;
using fortunes::kEot;

int main(int argc, char** argv) {
  fs::path dir = "fortunes_model";
  double seconds = 170;
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
    if (retrain || !fortunes::is_current(dir)) fortunes::train(dir, seconds);
    else fmt::print("using the checkpoint in {}\n", dir.string());
    // Load it back like any Hugging Face checkpoint.
    auto model = models::load_causal_lm(dir.string());
    Tokenizer tok = Tokenizer::from_file((dir / "tokenizer.json").string());
    models::GenerationConfig g = fortunes::sampling();
    g.max_new_tokens = 200;
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
