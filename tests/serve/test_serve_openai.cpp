// tpu-serve's OpenAI semantics over HTTP on 127.0.0.1: fresh seeds, n and best_of, stop strings
// billed exactly, logprobs in both response shapes (streamed too), echo, logit_bias, min_tokens
// and ignore_eos, models.retrieve, OpenAI-shaped errors for unsupported parameters, vLLM's
// metric names and /health.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "api.h"
#include "core/codegen_testing.h"
#include "serve/serve_testing.h"

using namespace tpu;
using namespace tpu::testing::serve;
using nlohmann::json;
using V = std::vector<int64_t>;

namespace {

// The served model: seed 47, 96-token context, 32 tokens per step.
struct Fixture : ModelFixture {
  Fixture() : ModelFixture(47, 96, 32) {}
};

json post(const Running& r, const std::string& path, const json& body, int& status) {
  auto c = r.client();
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(res);
  status = res->status;
  return json::parse(res->body);
}
json post_ok(const Running& r, const std::string& path, const json& body) {
  int status = 0;
  json j = post(r, path, body, status);
  INFO(j.dump());
  REQUIRE(status == 200);
  return j;
}

}  // namespace

TEST_CASE("tpu-serve api: unseeded requests differ, seeded ones repeat, n and best_of", "[serve][openai]") {
  Fixture f;
  Running r(f.model, f.tok, f.options());
  const json base{{"prompt", "Once"}, {"max_tokens", 8}, {"temperature", 1.0}, {"ignore_eos", true}};
  std::set<std::string> texts;
  for (int k = 0; k < 4 && texts.size() < 2; ++k)
    texts.insert(post_ok(r, "/v1/completions", base)["choices"][0]["text"].get<std::string>());
  CHECK(texts.size() >= 2);
  json seeded = base;
  seeded["seed"] = 1234;
  const std::string a = post_ok(r, "/v1/completions", seeded)["choices"][0]["text"];
  CHECK(post_ok(r, "/v1/completions", seeded)["choices"][0]["text"] == a);

  // n = 3: three choices, each its own sequence; choice 0 is the n = 1 request with the seed.
  json three = seeded;
  three["n"] = 3;
  json j = post_ok(r, "/v1/completions", three);
  REQUIRE(j["choices"].size() == 3);
  std::set<std::string> distinct;
  for (size_t i = 0; i < 3; ++i) {
    CHECK(j["choices"][i]["index"] == i);
    distinct.insert(j["choices"][i]["text"].get<std::string>());
  }
  CHECK(j["choices"][0]["text"] == a);
  CHECK(distinct.size() >= 2);
  CHECK(j["usage"]["completion_tokens"] == 24);

  // Streamed with n = 3: per index the same texts.
  json stream = three;
  stream["stream"] = true;
  Sse s = post_stream(r, "/v1/completions", stream.dump());
  REQUIRE(s.done);
  std::vector<std::string> streamed(3);
  for (const auto& e : s.events)
    for (const auto& c : e["choices"]) streamed[c["index"].get<size_t>()] += c["text"].get<std::string>();
  for (size_t i = 0; i < 3; ++i) CHECK(streamed[i] == j["choices"][i]["text"]);

  // best_of = 3, n = 1: the candidate (the n = 3 choices above, same seeds) with the highest
  // summed log-probability; all three are billed.
  json cand = three;
  cand["logprobs"] = 0;
  const json all = post_ok(r, "/v1/completions", cand);
  size_t best = 0;
  double best_sum = -INFINITY;
  for (size_t i = 0; i < 3; ++i) {
    double sum = 0;
    for (const auto& v : all["choices"][i]["logprobs"]["token_logprobs"]) sum += v.get<double>();
    if (sum > best_sum) best_sum = sum, best = i;
  }
  json bo = seeded;
  bo["best_of"] = 3;
  j = post_ok(r, "/v1/completions", bo);
  REQUIRE(j["choices"].size() == 1);
  CHECK(j["choices"][0]["text"] == all["choices"][best]["text"]);
  CHECK(j["choices"][0]["logprobs"].is_null());
  CHECK(j["usage"]["completion_tokens"] == 24);

  // Chat with n = 2.
  json chat{{"messages", json::array({json{{"role", "user"}, {"content", "hi"}}})}, {"n", 2}, {"max_tokens", 5},
            {"seed", 9}};
  j = post_ok(r, "/v1/chat/completions", chat);
  REQUIRE(j["choices"].size() == 2);
  CHECK(j["choices"][1]["index"] == 1);
}

TEST_CASE("tpu-serve api: a stop string bills exactly the tokens up to the one that completes it", "[serve][openai]") {
  Fixture f;
  Running r(f.model, f.tok, f.options());
  const std::string prompt = "The stop";
  // The reference tokens (greedy, no eos) and their text.
  models::GenerationConfig g;
  g.max_new_tokens = 40;
  const V gen = models::generate(*f.model, {f.tok.encode(prompt)}, g)[0];
  const std::string text = f.tok.decode(gen, true);
  // A stop string of two ASCII letters or spaces from the middle of the text.
  size_t at = 10;
  auto plain = [&](size_t i) { return std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == ' '; };
  while (at + 1 < text.size() && !(plain(at) && plain(at + 1))) ++at;
  REQUIRE(at + 1 < text.size());
  const std::string stop = text.substr(at, 2);
  // Expected usage: the fewest tokens whose decoded text holds the stop string.
  size_t k = 1;
  while (k <= gen.size() && f.tok.decode(V(gen.begin(), gen.begin() + static_cast<std::ptrdiff_t>(k)), true).find(stop) ==
                                std::string::npos)
    ++k;
  const json body{{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}, {"stop", stop}};
  json j = post_ok(r, "/v1/completions", body);
  CHECK(j["usage"]["completion_tokens"] == k);
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  CHECK(j["choices"][0]["text"] == json::parse(json(text.substr(0, text.find(stop))).dump(-1, ' ', false, json::error_handler_t::replace)));
  json sb = body;
  sb["stream"] = true;
  sb["stream_options"] = {{"include_usage", true}};
  Sse s = post_stream(r, "/v1/completions", sb.dump());
  REQUIRE(s.done);
  REQUIRE(!s.events.empty());
  CHECK(s.events.back()["usage"]["completion_tokens"] == k);
  std::string streamed;
  for (const auto& e : s.events)
    if (!e["choices"].empty()) streamed += e["choices"][0]["text"].get<std::string>();
  CHECK(streamed == j["choices"][0]["text"]);

  // logit_bias (clamped to 100) forces the eos id 2: one token, reason stop; ignore_eos keeps
  // going to max_tokens; min_tokens 3 masks it for three tokens.
  json forced{{"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0}, {"logit_bias", {{"2", 1000}}}};
  j = post_ok(r, "/v1/completions", forced);
  CHECK(j["usage"]["completion_tokens"] == 1);
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  forced["ignore_eos"] = true;
  j = post_ok(r, "/v1/completions", forced);
  CHECK(j["usage"]["completion_tokens"] == 5);
  CHECK(j["choices"][0]["finish_reason"] == "length");
  forced.erase("ignore_eos");
  forced["min_tokens"] = 3;
  j = post_ok(r, "/v1/completions", forced);
  CHECK(j["usage"]["completion_tokens"] == 4);
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  // A positive bias on 'Z' (90): every token is 'Z'.
  j = post_ok(r, "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"logit_bias", {{"90", 100}}}});
  CHECK(j["choices"][0]["text"] == "ZZZZ");
}

TEST_CASE("tpu-serve api: logprobs in the completions and chat shapes, streamed too, and echo", "[serve][openai]") {
  Fixture f;
  Running r(f.model, f.tok, f.options());
  const std::string prompt = "abc";
  // The reference: log_softmax of the library's forward over prompt + generated tokens, by a naive loop.
  models::GenerationConfig g;
  g.max_new_tokens = 6;
  const V p = f.tok.encode(prompt);
  const V gen = models::generate(*f.model, {p}, g)[0];
  V full = p;
  full.insert(full.end(), gen.begin(), gen.end());
  const auto T = static_cast<int64_t>(full.size());
  const std::vector<float> logits =
      f.model->forward(from_vector(full, Shape{1, T}, TensorOptions(DType::i64, f.model->device()))).to_vector<float>();
  const size_t vocab = 257;
  std::vector<double> want;
  for (size_t k = 0; k < gen.size(); ++k) {
    const float* row = logits.data() + (p.size() - 1 + k) * vocab;
    double m = -INFINITY, z = 0;
    for (size_t v = 0; v < vocab; ++v) m = std::max(m, double(row[v]));
    for (size_t v = 0; v < vocab; ++v) z += std::exp(double(row[v]) - m);
    want.push_back(double(row[gen[k]]) - m - std::log(z));
  }
  json j = post_ok(r, "/v1/completions",
                   json{{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 2}});
  const json& lp = j["choices"][0]["logprobs"];
  REQUIRE(lp["token_logprobs"].size() == 6);
  REQUIRE(lp["tokens"].size() == 6);
  REQUIRE(lp["text_offset"].size() == 6);
  CHECK(lp["text_offset"][0] == 0);
  for (size_t k = 0; k < 6; ++k) {
    CHECK(std::abs(lp["token_logprobs"][k].get<double>() - want[k]) < 1e-4);
    // A dict by token text: two tokens of the same text (bytes that are not UTF-8 alone) share a key.
    const json& top = lp["top_logprobs"][k];
    CHECK((top.size() == 1 || top.size() == 2));
    double best = -INFINITY;
    for (const auto& [key, v] : top.items()) best = std::max(best, v.get<double>());
    CHECK(best >= want[k] - 1e-4);
  }
  // Chat: {"content": [{token, logprob, bytes, top_logprobs}]}, and the same streamed.
  const json chat{{"messages", json::array({json{{"role", "user"}, {"content", "x"}}})},
                  {"max_tokens", 5},
                  {"temperature", 0},
                  {"ignore_eos", true},
                  {"logprobs", true},
                  {"top_logprobs", 3}};
  j = post_ok(r, "/v1/chat/completions", chat);
  const json& content = j["choices"][0]["logprobs"]["content"];
  REQUIRE(content.size() == 5);
  for (const auto& c : content) {
    CHECK(c["top_logprobs"].size() == 3);
    CHECK(c["logprob"].get<double>() <= 0);
    CHECK(c["bytes"].is_array());
    CHECK(c["top_logprobs"][0]["logprob"].get<double>() >= c["logprob"].get<double>() - 1e-9);
  }
  json cs = chat;
  cs["stream"] = true;
  Sse s = post_stream(r, "/v1/chat/completions", cs.dump());
  REQUIRE(s.done);
  json streamed = json::array();
  for (const auto& e : s.events)
    for (const auto& c : e["choices"])
      if (c["logprobs"].is_object())
        for (const auto& x : c["logprobs"]["content"]) streamed.push_back(x);
  CHECK(streamed == content);
  // Without logprobs: null.
  j = post_ok(r, "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 2}});
  CHECK(j["choices"][0]["logprobs"].is_null());
  // echo: the prompt text, then the completion; with logprobs a 400 naming 'echo'.
  j = post_ok(r, "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}, {"echo", true}});
  CHECK(j["choices"][0]["text"].get<std::string>().rfind(prompt, 0) == 0);
  j = post_ok(r, "/v1/completions", json{{"prompt", json::array({97, 98})}, {"max_tokens", 3}, {"echo", true}});
  CHECK(j["choices"][0]["text"].get<std::string>().rfind("ab", 0) == 0);
  // echo with logprobs: the prompt's tokens first (the first one null), from the same reference.
  const json eb{{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 1},
                {"echo", true}};
  j = post_ok(r, "/v1/completions", eb);
  const json& el = j["choices"][0]["logprobs"];
  REQUIRE(el["token_logprobs"].size() == full.size());
  CHECK(el["token_logprobs"][0].is_null());
  CHECK(el["top_logprobs"][0].is_null());
  CHECK(el["text_offset"][0] == 0);
  CHECK(el["text_offset"][p.size()] == prompt.size());
  for (size_t i = 1; i < full.size(); ++i) {
    const float* row = logits.data() + (i - 1) * vocab;
    double m = -INFINITY, z = 0;
    for (size_t v = 0; v < vocab; ++v) m = std::max(m, double(row[v]));
    for (size_t v = 0; v < vocab; ++v) z += std::exp(double(row[v]) - m);
    INFO("position " << i);
    CHECK(std::abs(el["token_logprobs"][i].get<double>() - (double(row[full[i]]) - m - std::log(z))) < 1e-4);
  }
  json es = eb;
  es["stream"] = true;
  Sse se = post_stream(r, "/v1/completions", es.dump());
  REQUIRE(se.done);
  json streamed_lp = json::array();
  std::string echoed;
  for (const auto& e : se.events)
    for (const auto& c : e["choices"]) {
      echoed += c["text"].get<std::string>();
      if (c["logprobs"].is_object())
        for (const auto& v : c["logprobs"]["token_logprobs"]) streamed_lp.push_back(v);
    }
  CHECK(streamed_lp == el["token_logprobs"]);
  CHECK(echoed == j["choices"][0]["text"]);
}

TEST_CASE("tpu-serve api: unsupported parameters are 400s naming them, models.retrieve, health, vLLM metrics",
          "[serve][openai]") {
  Fixture f;
  Running r(f.model, f.tok, f.options());
  const json msgs = json::array({json{{"role", "user"}, {"content", "hi"}}});
  struct Case {
    json body;
    std::string param;
  };
  const std::vector<Case> chat_cases{
      {{{"messages", msgs}, {"tools", json::array({json{{"type", "function"}, {"function", {{"name", "f"}, {"parameters",
          {{"type", "object"}, {"properties", {{"s", {{"type", "string"}, {"pattern", "a+"}}}}}}}}}}})},
        {"tool_choice", "required"}}, "tools"},
      {{{"messages", msgs}, {"tools", json::array({json{{"type", "function"}}})}}, "tools[0]"},
      {{{"messages", msgs}, {"tool_choice", "auto"}}, "tool_choice"},
      {{{"messages", msgs}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema",
          {{"type", "string"}, {"minLength", 2}}}}}}}}, "response_format"},
      {{{"messages", msgs}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema",
          {{"$ref", "#/$defs/a"}}}}}}}}, "response_format"},
      {{{"messages", msgs}, {"response_format", {{"type", "yaml"}}}}, "response_format"},
      {{{"messages", msgs}, {"functions", json::array({json{{"name", "f"}}})}}, "functions"},
      {{{"messages", msgs}, {"guided_json", {{"type", "object"}}}}, "guided_json"},
      {{{"messages", msgs}, {"top_logprobs", 2}}, "top_logprobs"},
      {{{"messages", msgs}, {"echo", true}}, "echo"},
  };
  for (const auto& c : chat_cases) {
    INFO(c.body.dump());
    int status = 0;
    json j = post(r, "/v1/chat/completions", c.body, status);
    CHECK(status == 400);
    CHECK(j["error"]["param"] == c.param);
    CHECK(j["error"]["type"] == "invalid_request_error");
    CHECK((j["error"]["code"].is_string() || j["error"]["code"].is_null()));
    CHECK(j["error"]["message"].get<std::string>().find(c.param) != std::string::npos);
  }
  int status = 0;
  json j = post(r, "/v1/completions", json{{"prompt", "x"}, {"suffix", "y"}}, status);
  CHECK(status == 400);
  CHECK(j["error"]["param"] == "suffix");
  CHECK(j["error"]["code"] == "unsupported_parameter");
  j = post(r, "/v1/completions", json{{"prompt", "x"}, {"temperature", 9}}, status);
  CHECK(status == 400);
  CHECK(j["error"]["code"].is_null());
  CHECK(j["error"]["param"] == "temperature");
  // Fields that change nothing are accepted, as are the neutral values of the refused ones.
  post_ok(r, "/v1/chat/completions",
          json{{"messages", msgs}, {"max_tokens", 2}, {"user", "u"}, {"metadata", {{"k", "v"}}}, {"store", false},
               {"response_format", {{"type", "text"}}}, {"tool_choice", "none"}, {"tools", json::array()}});

  // models.retrieve.
  auto c = r.client();
  auto m = c.Get("/v1/models/tiny");
  REQUIRE(m);
  CHECK(m->status == 200);
  CHECK(json::parse(m->body)["id"] == "tiny");
  CHECK(json::parse(m->body)["object"] == "model");
  m = c.Get("/v1/models/gpt-4");
  REQUIRE(m);
  CHECK(m->status == 404);
  j = json::parse(m->body);
  CHECK(j["error"]["code"] == "model_not_found");
  CHECK(j["error"]["type"] == "invalid_request_error");
  j = post(r, "/v1/completions", json{{"prompt", "x"}, {"model", "gpt-4"}}, status);
  CHECK(status == 404);
  CHECK(j["error"]["code"] == "model_not_found");

  // /health as vLLM: 200, empty body.
  auto h = c.Get("/health");
  REQUIRE(h);
  CHECK(h->status == 200);
  CHECK(h->body.empty());

  // vLLM's metric names: after one more request of 4 prompt tokens and 3 generated, idle.
  const auto before = r.server->engine().metrics();
  post_ok(r, "/v1/completions", json{{"prompt", "abcd"}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}});
  std::string body;
  for (int k = 0; k < 200; ++k) {
    auto met = c.Get("/metrics");
    REQUIRE(met);
    body = met->body;
    if (body.find("vllm:num_requests_running{model_name=\"tiny\"} 0") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto after = r.server->engine().metrics();
  CHECK(after.prompt_tokens - before.prompt_tokens == 4);
  CHECK(after.generation_tokens - before.generation_tokens == 3);
  CHECK(body.find("vllm:num_requests_running{model_name=\"tiny\"} 0\n") != std::string::npos);
  CHECK(body.find("vllm:num_requests_waiting{model_name=\"tiny\"} 0\n") != std::string::npos);
  CHECK(body.find("vllm:kv_cache_usage_perc{model_name=\"tiny\"} 0\n") != std::string::npos);
  CHECK(body.find(fmt::format("vllm:prompt_tokens_total{{model_name=\"tiny\"}} {}\n", after.prompt_tokens)) !=
        std::string::npos);
  CHECK(body.find(fmt::format("vllm:generation_tokens_total{{model_name=\"tiny\"}} {}\n", after.generation_tokens)) !=
        std::string::npos);
  CHECK(body.find(fmt::format("vllm:e2e_request_latency_seconds_count{{model_name=\"tiny\"}} {}\n",
                              after.requests_finished)) != std::string::npos);
  CHECK(body.find("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"}") != std::string::npos);
  CHECK(body.find("# TYPE vllm:time_per_output_token_seconds histogram") != std::string::npos);
}

// The official OpenAI client (npm package, scripts/setup_openai_client.sh) against the server:
// its own CTest ("serve: openai node client"), skipped with a message when node or the package
// is missing.
namespace {
// The node client's cases against a server of `model` (the fixture's checkpoint on some device).
void run_node_client(ModelFixture& f, std::shared_ptr<models::CausalLM> model) {
  const std::string dir = TPU_OPENAI_CLIENT_DIR;
  if (std::system("node --version > /dev/null 2>&1") != 0 ||
      !std::filesystem::exists(dir + "/node_modules/openai/package.json")) {
    std::printf("SKIPPED: node or the npm package openai is missing (scripts/setup_openai_client.sh %s)\n", dir.c_str());
    return;
  }
  const char* device = model->device().type == DeviceType::sim ? "sim" : "cpu";
  Running r(std::move(model), f.tok, f.options());
  const std::string cmd =
      fmt::format("timeout 120 node {} {} {} tiny {} 2>&1", TPU_OPENAI_CLIENT_TEST, dir, r.port, device);
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("all passed") != std::string::npos);
}
}  // namespace

TEST_CASE("tpu-serve api: the official OpenAI node client", "[.][node]") {
  // A longer context than the other cases: structured outputs may take a few hundred tokens.
  ModelFixture f(47, 512, 32);
  run_node_client(f, f.model);
}

// The same client cases with the model on the simulated chip (tiny preset), as
// `tpu-serve --device sim:N` serves it.
TEST_CASE("tpu-serve api: the official OpenAI node client, model on the simulated chip", "[.][node-sim]") {
  tpu::testing::TinySim chip;
  ModelFixture f(47, 512, 32);
  run_node_client(f, models::load_causal_lm(f.dir.string(), chip.dev()));
}

// The same with the parameters in bf16 (batch invariance at bf16: the cpu's few-row and packed
// kernels, the chip's bf16 programs), on the cpu and on the simulated chip.
TEST_CASE("tpu-serve api: the official OpenAI node client, bf16", "[.][node-bf16]") {
  ModelFixture f(47, 512, 32);
  run_node_client(f, models::load_causal_lm(f.dir.string(), models::LoadOptions{.device = Device(), .dtype = DType::bf16}));
}

TEST_CASE("tpu-serve api: the official OpenAI node client, bf16 model on the simulated chip", "[.][node-sim-bf16]") {
  tpu::testing::TinySim chip;
  ModelFixture f(47, 512, 32);
  run_node_client(f, models::load_causal_lm(f.dir.string(), models::LoadOptions{.device = chip.dev(), .dtype = DType::bf16}));
}
