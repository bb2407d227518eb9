// Peak memory of models::load_causal_lm against the model's size. The program writes a
// checkpoint of a ~100M-parameter CausalLM (12 layers, hidden 768, MLP 2048, 12 / 4 heads, vocab
// 32000, tied head: 401 MB in f32) to a temporary folder, then loads it in fresh child
// processes (this program started again with --child, so nothing of the writer is resident) as
// f32 and as bf16, and prints each child's peak resident memory (VmHWM of /proc/self/status)
// above what it held before loading, next to the loaded model's bytes and its largest tensor;
// rows "whole-*" load the way that holds the whole file in memory first, for comparison.
//
//   bench_load [--layers N]     (N: decoder layers, default 12; fewer for a quick run)
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tpucore/models.h"
#include "tpucore/safetensors.h"

using namespace tpu;

namespace {

// A field of /proc/self/status in bytes (its value is in kB).
int64_t status_bytes(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(f, line))
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') return std::stoll(line.substr(n + 1)) * 1024;
  return -1;
}

models::ModelConfig shape(int64_t layers) {
  models::ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 32000, c.hidden_size = 768, c.intermediate_size = 2048, c.num_hidden_layers = layers;
  c.num_attention_heads = 12, c.num_key_value_heads = 4;
  c.tie_word_embeddings = true;
  return c;
}

// The way that holds the whole file: a random f32 model, the checkpoint read into a map,
// converted and copied (for comparison; the same public calls load_causal_lm once made).
std::shared_ptr<models::CausalLM> load_whole(const std::string& dir, DType dt) {
  std::ifstream f(dir + "/config.json");
  std::stringstream ss;
  ss << f.rdbuf();
  auto m = std::make_shared<models::CausalLM>(models::ModelConfig::from_json(ss.str()));
  auto weights = load_safetensors(dir + "/model.safetensors");
  m->to(dt);
  m->load_state_dict(weights, true);
  return m;
}

int child(const std::string& dir, const std::string& mode) {
  const bool whole = mode.rfind("whole-", 0) == 0;
  const std::string dtype = whole ? mode.substr(6) : mode;
  const int64_t before = status_bytes("VmHWM");
  const auto t0 = std::chrono::steady_clock::now();
  const DType dt = dtype == "bf16" ? DType::bf16 : DType::f32;
  auto m = whole ? load_whole(dir, dt) : models::load_causal_lm(dir, Device(), dt);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t peak = status_bytes("VmHWM");
  int64_t model = 0, largest = 0;
  for (auto& [n, p] : m->named_parameters()) {
    model += static_cast<int64_t>(p.nbytes());
    largest = std::max<int64_t>(largest, static_cast<int64_t>(p.nbytes()));
  }
  const double mb = 1e-6;
  std::printf("%-10s  %9.1f  %9.1f  %12.1f  %15.1f  %8.2f\n", mode.c_str(), model * mb, largest * mb,
              (peak - before) * mb, (peak - before - model) * mb, secs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--child") return child(argv[2], argv[3]);
  int64_t layers = 12;
  if (argc == 3 && std::string(argv[1]) == "--layers") layers = std::stoll(argv[2]);
  else if (argc != 1) {
    std::fprintf(stderr, "usage: bench_load [--layers N]\n");
    return 64;
  }
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tpu_bench_load_" + std::to_string(getpid()));
  {
    Generator g(1);
    models::CausalLM m(shape(layers), &g);
    models::save_causal_lm(m, dir.string());
  }
  const auto file_bytes = fs::file_size(dir / "model.safetensors");
  std::printf("checkpoint: %lld-layer CausalLM, model.safetensors %.1f MB (f32)\n", static_cast<long long>(layers),
              static_cast<double>(file_bytes) * 1e-6);
  std::printf("load        model MB  largest MB  peak rise MB  above model MB  load s\n");
  std::fflush(stdout);
  int rc = 0;
  for (const char* dt : {"f32", "bf16", "whole-f32", "whole-bf16"}) {
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/proc/self/exe", argv[0], "--child", dir.c_str(), dt, static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  fs::remove_all(dir);
  return rc;
}
