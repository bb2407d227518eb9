// The tpu-serve binary serving a mixture-of-experts model: a tiny random Qwen3-MoE checkpoint
// (Hugging Face layout, per-expert tensors, a dense mlp_only layer) with a byte-level tokenizer,
// started on 127.0.0.1; greedy completions over HTTP (plain and streamed, two prompts in flight
// at once) equal models::generate() on the same checkpoint, decoded by the same tokenizer.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>

#include "core/moe_reference.h"
#include "serve/serve_testing.h"

using namespace tpu;
using namespace tpu::testing::serve;
using nlohmann::json;
namespace llm = tpu::testing::llm;

namespace {

// The server's JSON text: each invalid UTF-8 byte replaced by U+FFFD, as the server writes it.
std::string moe_json_text(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
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
  auto expected = [&](const std::string& prompt, int64_t n) {
    models::GenerationConfig g;
    g.max_new_tokens = n;
    return moe_json_text(tok.decode(models::generate(*model, {tok.encode(prompt)}, g)[0], true));
  };
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
