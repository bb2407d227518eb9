// Learns a byte-level BPE vocabulary on the Debian `fortunes` corpus and trains a small
// Llama-style model on its tokens on the cpu, saves
// it as a Hugging Face checkpoint (config.json, model.safetensors, tokenizer.json), reports its
// bits per byte on held-out fortunes, then loads it like any checkpoint to generate fortunes.
//
// DIR (default ./fortunes_model) is reused when it already holds a checkpoint of the current
// training recipe (fortunes_recipe.txt), so only the first run trains. The corpus is every text
// file of /usr/share/games/fortunes (package `fortunes`), each fortune followed by the
// <|endoftext|> token; every 20th fortune is held out for validation. The shape and schedule
// options change the recipe for experiments (the checkpoint is then still labelled with the
// default recipe's version: use --retrain or another --dir).
#include "fortunes_model.h"
#include "tools/cli_args.h"

namespace fs = std::filesystem;
using namespace tpu;
using fortunes::kEot;

int main(int argc, char** argv) {
  std::string dir = "fortunes_model";
  int64_t samples = 4;
  bool retrain = false, expect_below_unigram = false;
  fortunes::Recipe r;
  cli::Parser p("train_fortunes",
                "Trains the fortunes model (BPE tokens) on the cpu (once; cached in DIR), reports its validation\n"
                "bits per byte against a unigram baseline and samples fortunes from the saved checkpoint.");
  auto i64 = [&](int64_t& to) { return [&to, &p](const std::string& v) { to = p.to_int(v); }; };
  p.value("--dir", "DIR", "checkpoint folder (default fortunes_model)", [&](const std::string& v) { dir = v; });
  p.value("--seconds", "S", "training time (default 170)", [&](const std::string& v) { r.seconds = p.to_double(v); });
  p.value("--steps", "N", "train exactly N steps instead (the schedule follows steps)", i64(r.max_steps));
  p.value("--cpu-seconds", "S", "train for S s of process cpu time instead (the schedule follows it)",
          [&](const std::string& v) { r.cpu_seconds = p.to_double(v); });
  p.value("--samples", "N", "fortunes to sample afterwards (default 4)", i64(samples));
  p.flag("--retrain", "train even when DIR holds a current checkpoint", [&] { retrain = true; });
  p.value("--vocab", "N", "BPE vocabulary learnt on the training fortunes (default 2048; 257: bytes only)",
          i64(r.vocab));
  p.value("--layers", "N", "decoder layers (default 3)", i64(r.layers));
  p.value("--hidden", "N", "hidden size (default 128)", i64(r.hidden));
  p.value("--inter", "N", "MLP size (default 384)", i64(r.inter));
  p.value("--heads", "N", "attention heads (default 4)", i64(r.heads));
  p.value("--kv-heads", "N", "key/value heads (default 2)", i64(r.kv_heads));
  p.value("--batch", "N", "sequences per step (default 16)", i64(r.batch));
  p.value("--ctx", "N", "tokens per sequence (default 128)", i64(r.ctx));
  p.value("--lr", "X", "peak learning rate (default 4e-3)", [&](const std::string& v) { r.peak_lr = p.to_double(v); });
  p.value("--eval-tokens", "N", "validation tokens scored (default 16384; 0: all)", i64(r.eval_tokens));
  p.value("--threads", "N", "cpu threads of the training steps (default: the faster of 1 and all, timed)",
          [&](const std::string& v) { r.threads = static_cast<int>(p.to_int(v)); });
  p.flag("--eager", "run the training step eagerly instead of through tpu::compile", [&] { r.compiled = false; });
  p.flag("--expect-below-unigram",
         "exit 1 unless the validation bits per byte are below the unigram baseline over the same tokens",
         [&] { expect_below_unigram = true; });
  if (auto rc = p.parse(argc, argv)) return *rc;
  try {
    TPU_CHECK(samples >= 0, "--samples must not be negative, got {}", samples);
    if (retrain || expect_below_unigram || !fortunes::is_current(dir)) {
      const fortunes::TrainResult res = fortunes::train(dir, r, fortunes::read_split("/usr/share/games/fortunes", 20, r.vocab));
      if (expect_below_unigram) {
        TPU_CHECK(res.val_bits < res.unigram_bits,
                  "train_fortunes: validation {:.3f} bits per byte is not below the unigram baseline {:.3f}",
                  res.val_bits, res.unigram_bits);
        fmt::print("below the unigram baseline by {:.3f} bits per byte\n", res.unigram_bits - res.val_bits);
      }
    } else {
      fmt::print("using the checkpoint in {}\n", dir);
    }
    // Load it back like any Hugging Face checkpoint.
    auto model = models::load_causal_lm(dir);
    Tokenizer tok = Tokenizer::from_file((fs::path(dir) / "tokenizer.json").string());
    models::GenerationConfig g = fortunes::sampling();
    g.max_new_tokens = model->config.max_position_embeddings - 1;  // the first token is the prompt
    g.compile = true;
    for (int64_t s = 0; s < samples; ++s) {
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
