// The tpu-serve binary serving a mixture-of-experts model: a tiny random Qwen3-MoE checkpoint
// (Hugging Face layout, per-expert tensors, a dense mlp_only layer) with a byte-level tokenizer,
// started on 127.0.0.1; greedy completions over HTTP (plain and streamed, two prompts in flight
// at once) equal models::generate() on the same checkpoint, decoded by the same tokenizer.
// DeepSeek-V3 (multi-head latent attention) in the serving engine: the paged blocks hold the
// compressed latent; several requests of different lengths (chunked prefill beside decodes,
// shared prefixes) give generate()'s greedy tokens, eager and compiled, on the cpu and on the
// tiny simulated chip, and over HTTP from the tpu-serve binary; the cache's bytes per token
// equal layers * (kv_lora_rank + qk_rope_head_dim) * the element size.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>
#include <map>

#include "core/codegen_testing.h"
#include "core/moe_reference.h"
#include "serve/serve_testing.h"
#include "tpucore/autograd.h"
#include "tpucore/serve/engine.h"
#include "tpucore/serve/metrics.h"

using namespace tpu;
using namespace tpu::testing::serve;
using nlohmann::json;
namespace llm = tpu::testing::llm;

namespace {

// The server's JSON text: each invalid UTF-8 byte replaced by U+FFFD, as the server writes it.
std::string moe_json_text(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

// What the server should answer to `prompt` (greedy, n new tokens): generate()'s text as JSON
// carries it.
std::string moe_expected_text(models::CausalLM& m, const Tokenizer& tok, const std::string& prompt, int64_t n) {
  models::GenerationConfig g;
  g.max_new_tokens = n;
  return moe_json_text(tok.decode(models::generate(m, {tok.encode(prompt)}, g)[0], true));
}

// The tpu-serve process and its port (from its start-up line); killed and reaped at the end.
struct MoeServer {
  pid_t pid = -1;
  int port = 0;
  explicit MoeServer(const std::filesystem::path& dir) {
    int out[2];
    REQUIRE(pipe(out) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      dup2(out[1], 1);
      close(out[0]);
      execl(TPU_SERVE_EXE, TPU_SERVE_EXE, "--model", dir.c_str(), "--port", "0", "--served-model-name", "tiny-moe",
            "--max-model-len", "128", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    std::string line;
    char ch;
    for (int lines = 0; lines < 10 && line.find("http://") == std::string::npos; ++lines) {
      line.clear();
      while (line.find('\n') == std::string::npos && read(out[0], &ch, 1) == 1) line += ch;
    }
    close(out[0]);
    const auto colon = line.rfind(':');
    REQUIRE(colon != std::string::npos);
    port = std::stoi(line.substr(colon + 1));
  }
  ~MoeServer() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(5);
    c.set_read_timeout(20);
    return c;
  }
};

}  // namespace

TEST_CASE("tpu-serve binary: a Qwen3-MoE checkpoint, greedy completions over HTTP equal generate()", "[serve][http][moe]") {
  llm::TinyCfg c;
  c.vocab = 257;
  c.layers = 2;
  llm::make_moe(c, llm::MoeSpec{.mixtral = false, .experts = 4, .top_k = 2, .inter = 8, .norm_topk = true, .mlp_only = {0}});
  const auto dir = llm::temp_dir("serve_moe");
  llm::write_tiny_model(dir, c, DType::f32, 1, 61);
  write_byte_tokenizer(dir / "tokenizer.json");
  auto model = models::load_causal_lm(dir.string());
  REQUIRE(model->model->layers[1]->moe);
  const Tokenizer tok = Tokenizer::from_file((dir / "tokenizer.json").string());
  auto expected = [&](const std::string& prompt, int64_t n) { return moe_expected_text(*model, tok, prompt, n); };
  {
    MoeServer srv(dir);
    auto body = [](const std::string& prompt, int n, bool stream) {
      return json{{"model", "tiny-moe"}, {"prompt", prompt}, {"max_tokens", n}, {"temperature", 0},
                  {"ignore_eos", true}, {"stream", stream}}
          .dump();
    };
    // Two plain requests at once (batched by the engine), then a streamed one.
    auto ask = [&](const std::string& prompt) {
      auto res = srv.client().Post("/v1/completions", body(prompt, 10, false), "application/json");
      if (!res || res->status != 200) return std::string("<no answer>");
      return json::parse(res->body)["choices"][0]["text"].get<std::string>();
    };
    auto a = std::async(std::launch::async, ask, std::string("Mixture of"));
    auto b = std::async(std::launch::async, ask, std::string("experts!"));
    CHECK(a.get() == expected("Mixture of", 10));
    CHECK(b.get() == expected("experts!", 10));
    std::string streamed;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body("route", 8, true);
    req.set_header("Content-Type", "application/json");
    std::string buf;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      buf.append(d, n);
      return true;
    };
    auto res = srv.client().send(req);
    REQUIRE(res);
    CHECK(res->status == 200);
    for (size_t at = 0; (at = buf.find("data: {", at)) != std::string::npos;) {
      const size_t end = buf.find("\n\n", at);
      const json e = json::parse(buf.substr(at + 6, end - at - 6));
      if (!e["choices"].empty()) streamed += e["choices"][0]["text"].get<std::string>();
      at = end;
    }
    CHECK(buf.find("data: [DONE]") != std::string::npos);
    CHECK(streamed == expected("route", 8));
  }
  std::filesystem::remove_all(dir);
}

namespace {

// A tiny random DeepSeek-V3 checkpoint in Hub layout (low-rank queries, interleaved rope, one
// dense layer then routed + shared experts with group-limited routing) over the byte vocabulary,
// with its tokenizer: kv_lora_rank 12 + qk_rope_head_dim 4 = a latent of 16 values per token.
constexpr int64_t kDsLayers = 2, kDsLatent = 12 + 4;
std::filesystem::path write_deepseek_dir(uint32_t seed) {
  const std::string cfg = R"({"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
    "vocab_size": 257, "hidden_size": 16, "intermediate_size": 24, "moe_intermediate_size": 8,
    "num_hidden_layers": 2, "num_attention_heads": 3, "num_key_value_heads": 3, "q_lora_rank": 10,
    "kv_lora_rank": 12, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 4,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5, "rope_theta": 10000, "rms_norm_eps": 1e-5, "max_position_embeddings": 128,
    "norm_topk_prob": true, "rope_interleave": true, "tie_word_embeddings": false, "attention_bias": false,
    "topk_method": "noaux_tc", "scoring_func": "sigmoid", "hidden_act": "silu"})";
  models::CausalLM m(models::ModelConfig::from_json(cfg));
  REQUIRE(m.config.mla());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  NoGradGuard ng;
  for (auto& [name, t] : m.named_parameters()) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    const bool norm = name.find("norm") != std::string::npos;
    for (float& x : v) x = norm ? 1.0f + u(rng) : u(rng);
    copy_(t, from_vector(v, t.shape()));
  }
  const auto dir = llm::temp_dir("serve_deepseek");
  models::save_causal_lm(m, dir.string());
  write_byte_tokenizer(dir / "tokenizer.json");
  return dir;
}


std::vector<std::vector<int64_t>> ds_generate_each(models::CausalLM& m, const std::vector<std::vector<int64_t>>& prompts,
                                                   int64_t n) {
  models::GenerationConfig g;
  g.max_new_tokens = n;
  std::vector<std::vector<int64_t>> out;
  for (const auto& p : prompts) out.push_back(models::generate(m, {p}, g)[0]);
  return out;
}

}  // namespace

TEST_CASE("serve engine: DeepSeek-V3 (MLA latent pages) equals generate(), eager and compiled, on the cpu",
          "[serve][moe][mla]") {
  const auto dir = write_deepseek_dir(71);
  auto m = models::load_causal_lm(dir.string());
  std::filesystem::remove_all(dir);
  // Different lengths; the last two share their first 8 tokens (two blocks) for the prefix cache.
  const std::vector<std::vector<int64_t>> prompts{{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5}, {2, 7},
                                                  {11, 30, 8, 5, 17, 40, 2, 9, 100}, {11, 30, 8, 5, 17, 40, 2, 9, 7, 7}};
  const auto want = ds_generate_each(*m, prompts, 6);
  for (bool compiled : {false, true}) {
    INFO("compiled " << compiled);
    serve::EngineConfig ec;
    ec.block_size = 4;
    ec.max_num_batched_tokens = 10;  // prompts prefilled in chunks beside the others' decodes
    ec.max_model_len = 40;
    ec.enable_prefix_caching = true;
    ec.compile = compiled;
    ec.compile_name = "test_serve_deepseek_cpu";
    serve::Engine e(m, ec);
    CHECK(engine_greedy_tokens(e, {prompts[0], prompts[1], prompts[2]}, 6) == std::vector{want[0], want[1], want[2]});
    CHECK(engine_greedy_tokens(e, {prompts[3]}, 6)[0] == want[3]);  // its first two blocks come from the prefix cache
    const serve::EngineMetrics mt = e.metrics();
    CHECK(mt.prefix_cache_hit_tokens >= 8);
    // The latent only: layers * (kv_lora_rank + qk_rope_head_dim) f32 values per token.
    CHECK(mt.kv_bytes_per_token == kDsLayers * kDsLatent * 4);
    const std::string text = serve::prometheus_text(mt);
    CHECK(text.find(fmt::format("tpu_serve_kv_cache_bytes_per_token {}\n", kDsLayers * kDsLatent * 4)) != std::string::npos);
    CHECK(text.find(fmt::format("tpu_serve_kv_block_bytes {}\n", kDsLayers * kDsLatent * 4 * 4)) != std::string::npos);
  }
}

TEST_CASE("serve engine: DeepSeek-V3 with the model on the tiny simulated chip equals generate()",
          "[serve][moe][mla][codegen]") {
  testing::TinySim tiny;
  const auto dir = write_deepseek_dir(72);
  auto m = models::load_causal_lm(dir.string(), tiny.dev());
  std::filesystem::remove_all(dir);
  const std::vector<std::vector<int64_t>> prompts{{3, 1, 4, 1, 5, 9, 2}, {2, 7}, {11, 30, 8}};
  const auto want = ds_generate_each(*m, prompts, 4);
  for (bool compiled : {false, true}) {
    INFO("compiled " << compiled);
    serve::EngineConfig ec;
    ec.block_size = 4;
    ec.max_num_batched_tokens = 8;
    ec.max_model_len = 24;
    ec.max_num_seqs = 4;
    ec.compile = compiled;
    ec.compile_name = "test_serve_deepseek_sim";
    serve::Engine e(m, ec);
    const testing::ChipRunProbe probe;
    std::map<std::string, uint64_t> before;
    for (const auto& f : ops::fallback_counts()) before[f.op] += f.calls;
    CHECK(engine_greedy_tokens(e, prompts, 4) == want);
    CHECK(probe.new_runs() > 0);
    // Attention and the latent projections run as chip programs; the only host fallbacks are
    // the sigmoid group-limited router's ops (as in generate()).
    std::map<std::string, uint64_t> after;
    for (const auto& f : ops::fallback_counts()) after[f.op] += f.calls;
    for (const auto& [op, calls] : after)
      if (calls > before[op]) CHECK_THAT(op, Catch::Matches("gather|one_hot|sum|to_dtype"));
    CHECK(e.metrics().kv_bytes_per_token == kDsLayers * kDsLatent * 4);  // f32 latents on the chip
  }
}

TEST_CASE("tpu-serve binary: a DeepSeek-V3 checkpoint, greedy completions over HTTP equal generate()",
          "[serve][http][moe][mla]") {
  const auto dir = write_deepseek_dir(73);
  auto model = models::load_causal_lm(dir.string());
  const Tokenizer tok = Tokenizer::from_file((dir / "tokenizer.json").string());
  auto expected = [&](const std::string& prompt, int64_t n) { return moe_expected_text(*model, tok, prompt, n); };
  {
    MoeServer srv(dir);
    auto ask = [&](const std::string& prompt) {
      const std::string body = json{{"model", "tiny-moe"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0},
                                    {"ignore_eos", true}}
                                   .dump();
      auto res = srv.client().Post("/v1/completions", body, "application/json");
      if (!res || res->status != 200) return std::string("<no answer>");
      return json::parse(res->body)["choices"][0]["text"].get<std::string>();
    };
    auto a = std::async(std::launch::async, ask, std::string("latent attention"));
    auto b = std::async(std::launch::async, ask, std::string("MLA"));
    CHECK(a.get() == expected("latent attention", 8));
    CHECK(b.get() == expected("MLA", 8));
    auto res = srv.client().Get("/metrics");
    REQUIRE(res);
    CHECK(res->body.find(fmt::format("tpu_serve_kv_cache_bytes_per_token {}\n", kDsLayers * kDsLatent * 4)) !=
          std::string::npos);
  }
  std::filesystem::remove_all(dir);
}
