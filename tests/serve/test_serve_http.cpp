// tpu-serve over HTTP on 127.0.0.1: answers equal models::generate() decoded by the tokenizer
// (plain and streamed, completions and chat), malformed requests get 4xx JSON errors, and a
// bounded load of concurrent streaming clients (some disconnecting, some malformed) completes
// every valid request without leaking KV blocks.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <csignal>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api.h"
#include "core/codegen_testing.h"
#include "serve/serve_testing.h"
#include "tpucore/runtime/pjrt_client.h"

using namespace tpu;
using namespace tpu::testing::serve;
using nlohmann::json;

namespace {

// The server's JSON carries text as UTF-8 with each invalid byte (random models emit any byte)
// replaced by U+FFFD; the reference text goes through the same replacement.
std::string as_json_text(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

// The served model: seed 31, 64-token context, 24 tokens per step.
struct Fixture : ModelFixture {
  Fixture() : ModelFixture(31, 64, 24) {}
  // The reference: generate() one request at a time, greedy, stopping at the eos ids, decoded
  // (on `on`, default the served cpu model).
  std::pair<std::string, std::string> expected(const std::string& prompt, int64_t max_tokens,
                                               models::CausalLM* on = nullptr) {
    models::GenerationConfig g;
    g.max_new_tokens = max_tokens;
    g.stop_tokens = model->config.eos_token_ids;
    auto out = models::generate(on ? *on : *model, {tok.encode(prompt)}, g)[0];
    std::string reason = "length";
    if (!out.empty() && (out.back() == 2 || out.back() == 3) && static_cast<int64_t>(out.size()) <= max_tokens) {
      out.pop_back();
      reason = "stop";
    }
    return {as_json_text(tok.decode(out, true)), reason};
  }
};

json post_json(const Running& r, const std::string& path, const std::string& body, int& status) {
  auto c = r.client();
  auto res = c.Post(path.c_str(), body, "application/json");
  REQUIRE(res);
  status = res->status;
  return json::parse(res->body);
}

}  // namespace

TEST_CASE("tpu-serve: completions and chat, plain and streamed, equal generate()", "[serve][http]") {
  Fixture f;
  Running r(f.model, f.tok, f.options());
  int status = 0;
  {
    auto c = r.client();
    auto h = c.Get("/health");
    REQUIRE(h);
    CHECK(h->status == 200);
    auto m = c.Get("/v1/models");
    REQUIRE(m);
    CHECK(json::parse(m->body)["data"][0]["id"] == "tiny");
  }
  const std::string prompt = "Hello, wor";
  const auto [want, reason] = f.expected(prompt, 12);
  json j = post_json(r, "/v1/completions",
                     json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}}.dump(), status);
  CHECK(status == 200);
  CHECK(j["object"] == "text_completion");
  CHECK(j["choices"][0]["text"] == want);
  CHECK(j["choices"][0]["finish_reason"] == reason);
  CHECK(j["usage"]["prompt_tokens"] == 10);

  Sse s = post_stream(r, "/v1/completions",
                      json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true},
                           {"stream_options", {{"include_usage", true}}}}.dump());
  CHECK(s.status == 200);
  CHECK(s.done);
  std::string text;
  std::string finish;
  for (const auto& e : s.events) {
    if (e["choices"].empty()) {
      CHECK(e["usage"]["prompt_tokens"] == 10);
      continue;
    }
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  CHECK(text == want);
  CHECK(finish == reason);

  // Chat: the fixture's 'role: content' template.
  const json messages = json::array({json{{"role", "user"}, {"content", "hi"}}});
  const auto [chat_want, chat_reason] = f.expected("user: hi\nassistant:", 9);
  j = post_json(r, "/v1/chat/completions",
                json{{"messages", messages}, {"max_tokens", 9}, {"temperature", 0}}.dump(), status);
  CHECK(status == 200);
  CHECK(j["choices"][0]["message"]["content"] == chat_want);
  s = post_stream(r, "/v1/chat/completions",
                  json{{"messages", messages}, {"max_tokens", 9}, {"temperature", 0}, {"stream", true}}.dump());
  REQUIRE(s.done);
  REQUIRE(!s.events.empty());
  CHECK(s.events[0]["choices"][0]["delta"]["role"] == "assistant");
  text.clear();
  for (const auto& e : s.events) text += e["choices"][0]["delta"].value("content", "");
  CHECK(text == chat_want);
  CHECK(s.events.back()["choices"][0]["finish_reason"] == chat_reason);

  // A stop string (two ASCII characters of the expected text) cuts the text before it.
  int requests = 4;
  size_t at = 1;
  while (at + 1 < want.size() && !(std::isalnum(static_cast<unsigned char>(want[at])) &&
                                   std::isalnum(static_cast<unsigned char>(want[at + 1]))))
    ++at;
  if (at + 1 < want.size()) {
    const std::string stop = want.substr(at, 2);
    j = post_json(r, "/v1/completions",
                  json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"stop", stop}}.dump(), status);
    CHECK(j["choices"][0]["text"] == want.substr(0, want.find(stop)));
    CHECK(j["choices"][0]["finish_reason"] == "stop");
    ++requests;
  }
  // The running gauge is published at the end of each step: poll (bounded) for the idle state.
  std::string body;
  for (int k = 0; k < 200; ++k) {
    auto met = r.client().Get("/metrics");
    REQUIRE(met);
    body = met->body;
    if (body.find("tpu_serve_requests_running 0") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(body.find("tpu_serve_requests_running 0") != std::string::npos);
  CHECK(body.find("tpu_serve_kv_blocks_used 0") != std::string::npos);
  CHECK(body.find(fmt::format("tpu_serve_time_to_first_token_seconds_count {}", requests)) != std::string::npos);
}

TEST_CASE("tpu-serve: malformed requests get 4xx JSON errors and the server keeps serving", "[serve][http]") {
  Fixture f;
  Running r(f.model, f.tok, f.options());
  struct Case {
    std::string path, body;
    int status;
    std::string needle;
  };
  const std::string long_prompt(64, 'a');
  const std::vector<Case> cases{
      {"/v1/completions", "{\"prompt\": \"hi\", ", 400, "not valid JSON"},
      {"/v1/completions", "[1, 2]", 400, "JSON object"},
      {"/v1/completions", "{\"max_tokens\": 3}", 400, "'prompt' is required"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": \"3\"}", 400, "'max_tokens' must be an integer"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 0}", 400, "'max_tokens' must be in"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"temperature\": 7}", 400, "'temperature' must be in"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"n\": 0}", 400, "'n' must be in"},
      {"/v1/completions", "{\"prompt\": [1, 999]}", 400, "token id 999"},
      // Past int64: named as sent, not wrapped to -1.
      {"/v1/completions", "{\"prompt\": [1, 18446744073709551615]}", 400, "token id 18446744073709551615"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 18446744073709551615}", 400, "got 18446744073709551615"},
      {"/v1/completions", "{\"prompt\": {\"a\": 1}}", 400, "'prompt' must be"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": 5}", 400, "'stop'"},
      {"/v1/completions", json{{"prompt", long_prompt}}.dump(), 400, "maximum context length is 64"},
      {"/v1/completions", json{{"prompt", "abc"}, {"max_tokens", 62}}.dump(), 400, "you requested 65 tokens"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"model\": \"gpt-9\"}", 404, "'gpt-9' does not exist"},
      {"/v1/chat/completions", "{\"messages\": []}", 400, "'messages' must be a non-empty array"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", 400, "'robot'"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\"}]}", 400, "content is missing"},
      {"/v1/nothing", "{}", 404, "no route POST /v1/nothing"},
  };
  for (const auto& k : cases) {
    INFO(k.path << " " << k.body);
    int status = 0;
    json j = post_json(r, k.path, k.body, status);
    CHECK(status == k.status);
    REQUIRE(j.contains("error"));
    CHECK(j["error"]["message"].get<std::string>().find(k.needle) != std::string::npos);
  }
  int status = 0;
  json j = post_json(r, "/v1/completions", "{\"prompt\": \"ok\", \"max_tokens\": 2, \"temperature\": 0}", status);
  CHECK(status == 200);
  CHECK(j["usage"]["completion_tokens"].get<int>() >= 1);
  auto met = r.client().Get("/metrics");
  REQUIRE(met);
  CHECK(met->body.find("tpu_serve_http_errors_total{code=\"400\"} 17") != std::string::npos);
}

TEST_CASE("tpu-serve: bounded load of streaming clients, some leaving early, some malformed, no block leaks",
          "[serve][http]") {
  Fixture f;
  auto o = f.options();
  o.engine.max_model_len = 2048;  // room for the long requests of the clients that leave early
  Running r(f.model, f.tok, o);
  const int clients = 24;
  std::vector<std::thread> ts;
  std::vector<int> kind(clients), status(clients, 0);
  std::vector<Sse> got(clients);
  std::vector<std::pair<std::string, std::string>> want(clients);
  for (int i = 0; i < clients; ++i) {
    kind[i] = i % 4;  // 0, 1: stream to the end; 2: leave after 2 events; 3: malformed JSON
    if (kind[i] <= 1) want[i] = f.expected("client " + std::to_string(i) + ":", 10 + i % 7);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < clients; ++i)
    ts.emplace_back([&, i] {
      const std::string p = "client " + std::to_string(i) + ":";
      if (kind[i] == 3) {
        auto res = r.client().Post("/v1/completions", "{\"prompt\": \"x\", \"stream\": tru", "application/json");
        status[i] = res ? res->status : -1;
        if (!res) got[i].error = httplib::to_string(res.error());
        return;
      }
      const int max_tokens = kind[i] == 2 ? 2000 : 10 + i % 7;
      got[i] = post_stream(r, "/v1/completions",
                           json{{"prompt", p}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", true},
                                {"ignore_eos", kind[i] == 2}}.dump(),
                           kind[i] == 2 ? 2 : 0);
      status[i] = got[i].status;
    });
  for (auto& t : ts) t.join();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));
  for (int i = 0; i < clients; ++i) {
    INFO("client " << i << " kind " << kind[i] << " error " << got[i].error);
    if (kind[i] == 3) {
      CHECK(status[i] == 400);
    } else if (kind[i] <= 1) {
      CHECK(status[i] == 200);
      CHECK(got[i].done);
      std::string text;
      for (const auto& e : got[i].events) text += e["choices"][0]["text"].get<std::string>();
      CHECK(text == want[i].first);
    }
  }
  // Every block comes back, the disconnected clients' too (bounded wait for the last steps).
  serve::EngineMetrics m;
  for (int k = 0; k < 500; ++k) {
    m = r.server->engine().metrics();
    if (m.blocks_used == 0 && m.running == 0 && m.waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(m.blocks_used == 0);
  CHECK(m.running == 0);
  CHECK(m.requests_finished == 12);
  CHECK(m.requests_cancelled == 6);  // long before their 2000 tokens
  CHECK(m.generation_tokens < 6 * 2000);
}

TEST_CASE("tpu-serve: a non-streaming client that disconnects is cancelled and its blocks freed", "[serve][http]") {
  Fixture f;
  auto o = f.options();
  o.engine.max_model_len = 2048;
  Running r(f.model, f.tok, o);
  const std::string body =
      json{{"prompt", "leaving"}, {"max_tokens", 2000}, {"temperature", 0}, {"ignore_eos", true}}.dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(r.port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  serve::EngineMetrics m;
  for (int k = 0; k < 500; ++k) {  // until the request runs (bounded: 5 s)
    m = r.server->engine().metrics();
    if (m.running == 1 && m.generation_tokens > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(m.running == 1);
  close(fd);
  for (int k = 0; k < 500; ++k) {  // until it is gone (bounded: 5 s)
    m = r.server->engine().metrics();
    if (m.running == 0 && m.blocks_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(m.running == 0);
  CHECK(m.blocks_used == 0);
  CHECK(m.requests_cancelled == 1);
  CHECK(m.generation_tokens < 2000);
  // The server keeps serving.
  int status = 0;
  post_json(r, "/v1/completions", json{{"prompt", "after"}, {"max_tokens", 3}, {"temperature", 0}}.dump(), status);
  CHECK(status == 200);
}

TEST_CASE("tpu-serve: the chat prompt is the model's template, and no template or a rejected conversation is a 400",
          "[serve][http]") {
  const json messages = json::parse(R"([{"role": "system", "content": "s"},
                                        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])");
  const auto tmpl = ChatTemplate::from_source(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}");
  CHECK(serve_http::chat_prompt(messages, &tmpl) == "<system>s<user>ab<assistant>");
  auto status_of = [&](const ChatTemplate* t) {
    try {
      serve_http::chat_prompt(messages, t);
    } catch (const serve_http::ApiError& e) {
      return std::to_string(e.status) + " " + e.message;
    }
    return std::string("no error");
  };
  CHECK_THAT(status_of(nullptr), Catch::StartsWith("400") && Catch::Contains("--chat-template"));
  const auto strict = ChatTemplate::from_source("{% if messages[0].role == 'system' %}{{ raise_exception('no system role') }}{% endif %}");
  CHECK_THAT(status_of(&strict), Catch::StartsWith("400") && Catch::Contains("no system role"));
  // An image part (a multimodal model runs text-only): a 400 naming image inputs.
  const json with_image = json::parse(R"([{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}])");
  try {
    serve_http::chat_prompt(with_image, &tmpl);
    FAIL("an image part was accepted");
  } catch (const serve_http::ApiError& e) {
    CHECK(e.status == 400);
    CHECK_THAT(e.message, Catch::Contains("image inputs are not supported"));
  }
}

TEST_CASE("tpu-serve with the model on the simulated chip: greedy answers equal generate(), chip time in /metrics",
          "[serve][http][sim]") {
  tpu::testing::TinySim chip;
  Fixture f;
  auto on_chip = models::load_causal_lm(f.dir.string(), chip.dev());
  Running r(on_chip, f.tok, f.options());
  for (const std::string prompt : {"Hello, wor", "ab"}) {
    // generate() on the same chip, one request at a time (the chip's f32 products may round
    // differently from the cpu's, so near-ties of the random model can go the other way).
    const auto [want, reason] = f.expected(prompt, 6, on_chip.get());
    int status = 0;
    json j = post_json(r, "/v1/completions",
                       json{{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}}.dump(), status);
    REQUIRE(status == 200);
    CHECK(j["choices"][0]["text"] == want);
    CHECK(j["choices"][0]["finish_reason"] == reason);
  }
  auto c = r.client();
  auto m = c.Get("/metrics");
  REQUIRE(m);
  auto value = [&](const std::string& name) {
    const auto at = m->body.find("\n" + name + " ");
    REQUIRE(at != std::string::npos);
    return std::stod(m->body.substr(at + name.size() + 2));
  };
  CHECK(value("tpucore_sim_cycles_total") > 0);
  CHECK(value("tpucore_sim_mxu_flops_total") > 0);
  CHECK(value("tpucore_sim_seconds_per_generated_token") > 0);
  // On the cpu there is no chip to report.
  Running rc(f.model, f.tok, f.options());
  auto mc = rc.client().Get("/metrics");
  REQUIRE(mc);
  CHECK(mc->body.find("tpucore_sim_cycles_total") == std::string::npos);
}

namespace {
// A plain response: its JSON and headers.
httplib::Result post_raw(const Running& r, const std::string& path, const json& body) {
  auto c = r.client();
  return c.Post(path.c_str(), body.dump(), "application/json");
}
double header_ms(const httplib::Result& res, const std::string& name) {
  REQUIRE(res->has_header(name));
  return std::stod(res->get_header_value(name));
}
double metric_value(const Running& r, const std::string& name) {
  auto m = r.client().Get("/metrics");
  REQUIRE(m);
  const auto at = m->body.find("\n" + name + " ");
  REQUIRE(at != std::string::npos);
  return std::stod(m->body.substr(at + name.size() + 2));
}
}  // namespace

TEST_CASE("tpu-serve timing: host time to first token and per output token in headers and the last chunk",
          "[serve][http][timing]") {
  Fixture f;
  Running r(f.model, f.tok, f.options());
  const auto t0 = std::chrono::steady_clock::now();
  auto res = post_raw(r, "/v1/completions", json{{"prompt", "ab"}, {"max_tokens", 5}, {"ignore_eos", true}});
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(json::parse(res->body)["usage"]["completion_tokens"] == 5);
  // Host times are positive and within the client's own wall time; no chip on the cpu.
  const double ttft = header_ms(res, "x-tpucore-ttft-ms"), tpot = header_ms(res, "x-tpucore-tpot-ms");
  CHECK(ttft > 0);
  CHECK(tpot > 0);
  CHECK(ttft + 4 * tpot <= wall_ms);
  CHECK_FALSE(res->has_header("x-tpucore-sim-ttft-ms"));
  CHECK_FALSE(res->has_header("x-tpucore-sim-tpot-ms"));
  // One token: no time per output token.
  res = post_raw(r, "/v1/completions", json{{"prompt", "ab"}, {"max_tokens", 1}});
  REQUIRE(res);
  CHECK(header_ms(res, "x-tpucore-tpot-ms") == 0);
  // Streamed, with and without the usage chunk: the last chunk before [DONE] carries the timing.
  for (bool usage : {true, false}) {
    json body{{"messages", json::array({json{{"role", "user"}, {"content", "hi"}}})},
              {"max_tokens", 4}, {"ignore_eos", true}, {"stream", true}};
    if (usage) body["stream_options"] = {{"include_usage", true}};
    const Sse s = post_stream(r, "/v1/chat/completions", body.dump());
    REQUIRE(s.done);
    REQUIRE(s.events.size() >= 2);
    const json& last = s.events.back();
    CHECK(last.contains("usage") == usage);
    REQUIRE(last.contains("tpucore_timing"));
    CHECK(last["tpucore_timing"]["ttft_ms"].get<double>() > 0);
    CHECK(last["tpucore_timing"]["tpot_ms"].get<double>() > 0);
    CHECK_FALSE(last["tpucore_timing"].contains("sim_ttft_ms"));
    for (size_t i = 0; i + 1 < s.events.size(); ++i) CHECK_FALSE(s.events[i].contains("tpucore_timing"));
  }
}

TEST_CASE("tpu-serve timing on the simulated chip: the chip's seconds per request add up to /metrics",
          "[serve][http][timing][sim]") {
  tpu::testing::TinySim chip;
  Fixture f;
  Running r(models::load_causal_lm(f.dir.string(), chip.dev()), f.tok, f.options());
  // Loading and the cache's set-up run programs; the engine waits for them, so none finishes
  // later, inside a request's window of /metrics.
  const double startup = sim_stats().cycles;
  synchronize(chip.dev());
  CHECK(sim_stats().cycles == startup);
  const std::string total = "tpucore_sim_seconds_total";
  // The prefill alone: one token. Its chip time as /metrics counts it is the request's chip TTFT.
  const double s0 = metric_value(r, total);
  auto one = post_raw(r, "/v1/completions", json{{"prompt", "Hello"}, {"max_tokens", 1}});
  REQUIRE(one);
  REQUIRE(one->status == 200);
  const double prefill_s = metric_value(r, total) - s0;
  CHECK(prefill_s > 0);
  CHECK(header_ms(one, "x-tpucore-sim-ttft-ms") == Approx(1e3 * prefill_s).epsilon(1e-6));
  CHECK(header_ms(one, "x-tpucore-sim-tpot-ms") == 0);
  // The same prompt, 6 tokens: the same prefill, then 5 decode steps whose chip time is what
  // /metrics adds beyond the prefill.
  const double s1 = metric_value(r, total);
  auto six = post_raw(r, "/v1/completions", json{{"prompt", "Hello"}, {"max_tokens", 6}, {"ignore_eos", true}});
  REQUIRE(six);
  REQUIRE(six->status == 200);
  const double all_s = metric_value(r, total) - s1;
  CHECK(header_ms(six, "x-tpucore-sim-ttft-ms") == Approx(1e3 * prefill_s).epsilon(1e-6));
  CHECK(header_ms(six, "x-tpucore-sim-tpot-ms") == Approx(1e3 * (all_s - prefill_s) / 5).epsilon(1e-6));
  CHECK(header_ms(six, "x-tpucore-tpot-ms") > 0);
  // Streamed: the same chip figures in the last chunk.
  const Sse s = post_stream(r, "/v1/completions",
                            json{{"prompt", "Hello"}, {"max_tokens", 6}, {"ignore_eos", true}, {"stream", true}}.dump());
  REQUIRE(s.done);
  REQUIRE(!s.events.empty());
  const json& t = s.events.back()["tpucore_timing"];
  CHECK(t["sim_ttft_ms"].get<double>() == Approx(1e3 * prefill_s).epsilon(1e-6));
  CHECK(t["sim_tpot_ms"].get<double>() == Approx(1e3 * (all_s - prefill_s) / 5).epsilon(1e-6));
}

#ifdef TPU_PJRT_SIM_PLUGIN
TEST_CASE("tpu-serve on pjrt:0 (the simulator's PJRT plugin), eager and compiled: greedy answers equal generate() "
          "on the cpu, no host fallback", "[serve][http][pjrt]") {
  load_pjrt_plugin(TPU_PJRT_SIM_PLUGIN);
  // An op without a StableHLO counterpart fails the request; the plugin's chip multiplies f32
  // exactly (its default is one bf16 pass, as TPUs), so the answers can equal the cpu's.
  struct Strict {
    bool was = pjrt_host_fallback();
    std::string precision = float32_matmul_precision();
    Strict() {
      set_pjrt_host_fallback(false);
      set_float32_matmul_precision("highest");
    }
    ~Strict() {
      set_pjrt_host_fallback(was);
      set_float32_matmul_precision(precision);
    }
  } strict;
  Fixture f;
  auto on_pjrt = models::load_causal_lm(f.dir.string(), Device("pjrt:0"));
  for (bool compiled : {false, true}) {
    DYNAMIC_SECTION((compiled ? "compiled" : "eager")) {
      serve_http::ServerOptions o = f.options();
      o.engine.compile = compiled;
      o.engine.max_num_batched_tokens = 12;
      Running r(on_pjrt, f.tok, o);
      if (compiled) CHECK(r.server->engine().warm_up() > 0);
      const double executions = metric_value(r, compiled ? "tpucore_pjrt_graph_runs_total" : "tpucore_pjrt_executions_total");
      for (const std::string prompt : {"Hello, wor", "ab"}) {
        const auto [want, reason] = f.expected(prompt, 6);
        int status = 0;
        json j = post_json(r, "/v1/completions",
                           json{{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}}.dump(), status);
        REQUIRE(status == 200);
        CHECK(j["choices"][0]["text"] == want);
        CHECK(j["choices"][0]["finish_reason"] == reason);
      }
      CHECK(metric_value(r, compiled ? "tpucore_pjrt_graph_runs_total" : "tpucore_pjrt_executions_total") > executions);
      CHECK(metric_value(r, "tpucore_pjrt_host_fallbacks_total") == 0);
    }
  }
}
#endif
