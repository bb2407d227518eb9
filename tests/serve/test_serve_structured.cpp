// Structured output and tool calling: the JSON automaton (tpucore/serve/json_constraint.h)
// against nlohmann::json's parser and a small JSON-schema check written here, on random strings
// and random masked walks over a tiny vocabulary; the engine's greedy output under a schema;
// tool-call parsing; and tpu-serve's response_format / tools over HTTP.
#include <catch2/catch.hpp>

#include <random>
#include <cctype>

#include "api.h"
#include "serve/serve_testing.h"
#include "structured.h"
#include "tpucore/serve/engine.h"

using namespace tpu;
using namespace tpu::testing::serve;
using nlohmann::json;
using serve::JsonConstraint;

namespace {

// An independent check of the schema subset: type, properties, required, additionalProperties,
// items, enum, const, anyOf.
bool st_valid(const json& v, const json& s) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("const")) return v == s["const"];
  if (s.contains("enum")) return std::find(s["enum"].begin(), s["enum"].end(), v) != s["enum"].end();
  if (s.contains("anyOf"))
    return std::any_of(s["anyOf"].begin(), s["anyOf"].end(), [&](const json& a) { return st_valid(v, a); });
  if (s.contains("type")) {
    const json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    bool ok = false;
    for (const json& t : types) {
      const std::string n = t.get<std::string>();
      ok = ok || (n == "object" && v.is_object()) || (n == "array" && v.is_array()) ||
           (n == "string" && v.is_string()) || (n == "number" && v.is_number()) ||
           (n == "integer" && v.is_number_integer()) || (n == "boolean" && v.is_boolean()) ||
           (n == "null" && v.is_null());
    }
    if (!ok) return false;
  }
  if (v.is_object()) {
    const json props = s.value("properties", json::object());
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!st_valid(x, props[k])) return false;
      } else if (s.contains("additionalProperties") && !st_valid(x, s["additionalProperties"])) {
        return false;
      }
    }
    for (const json& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
  }
  if (v.is_array() && s.contains("items"))
    for (const json& x : v)
      if (!st_valid(x, s["items"])) return false;
  return true;
}

std::shared_ptr<const serve::TokenBytes> st_vocab(const std::vector<std::string>& toks) {
  std::vector<std::optional<std::string>> b(toks.begin(), toks.end());
  b.push_back(std::nullopt);  // a special token without text
  return std::make_shared<const serve::TokenBytes>(b);
}

bool st_accepts(const JsonConstraint& g, const std::string& s) {
  auto state = g.start();
  return g.feed(state, s) && g.complete(state);
}

}  // namespace

TEST_CASE("json constraint: accepts exactly what nlohmann::json parses, on random short strings", "[serve][structured]") {
  const auto vocab = st_vocab({"a"});
  const auto any = JsonConstraint::compile(true, vocab);
  const auto object = JsonConstraint::compile(nullptr, vocab);
  const std::string alphabet = "{}[],:\"a10-.eE+ tru\\n\xc3\xa9";
  std::mt19937 rng(5);
  int valid = 0;
  for (int i = 0; i < 12000; ++i) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < n; ++k) s += alphabet[rng() % alphabet.size()];
    if (s.back() == ' ') continue;  // trailing whitespace: the automaton ends at the value
    // Exponents have at most 2 digits in the automaton (no overflow to infinity).
    bool long_exponent = false;
    for (size_t k = 0; k < s.size(); ++k)
      if (s[k] == 'e' || s[k] == 'E') {
        size_t d = k + 1 < s.size() && (s[k + 1] == '+' || s[k + 1] == '-') ? k + 2 : k + 1, digits = 0;
        while (d < s.size() && std::isdigit(static_cast<unsigned char>(s[d]))) ++d, ++digits;
        long_exponent = long_exponent || digits > 2;
      }
    if (long_exponent) continue;
    const json j = json::parse(s, nullptr, false);
    INFO(json(s).dump(-1, ' ', true, json::error_handler_t::replace));
    CHECK(st_accepts(*any, s) == !j.is_discarded());
    CHECK(st_accepts(*object, s) == (!j.is_discarded() && j.is_object()));
    valid += !j.is_discarded();
  }
  CHECK(valid > 100);
  for (const std::string s : {"\"\\ud800\"", "\"\xc0\x80\"", "\"\xed\xa0\x80\"", "01", "[1,]", "{\"a\":1,}", "1.", "-"}) {
    INFO(s);
    CHECK_FALSE(st_accepts(*any, s));
  }
  for (const std::string s : {"\"\\u00e9\\n\"", "\"\xe2\x82\xac\"", "-0.5e+10", "{\"a\": [true, null, {}]}"}) {
    INFO(s);
    CHECK(st_accepts(*any, s));
  }
}

TEST_CASE("json constraint: random masked walks end in documents that validate against the schema", "[serve][structured]") {
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string"},
      "age": {"type": "integer"},
      "score": {"type": ["number", "null"]},
      "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}},
      "kind": {"const": "x"},
      "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                "additionalProperties": false},
      "either": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]}
    },
    "required": ["name", "inner"],
    "additionalProperties": false})");
  const auto vocab = st_vocab({"{", "}", "[", "]", ",", ":", "\"", " ", "\n", "a", "b", "ab", "\\", "n", "u", "00e9",
                               "0", "1", "12", "-", ".", "e", "+", "true", "false", "null", "tr", "ue", "\"name\"",
                               "\"age\":", "\"score\": ", "\"tags\"", "\"kind\"", "x", "\"x\"", "\"inner\"", "ok",
                               "\"either\"", "age", "name", "inner", "score", "tags", "kind", "either", "\xc3",
                               "\xa9", "{\"", "\"}", "3", "\",\""});
  const auto g = JsonConstraint::compile(schema, vocab);
  std::mt19937 rng(11);
  int completed = 0;
  for (int walk = 0; walk < 60; ++walk) {
    auto state = g->start();
    std::string text;
    for (int step = 0; step < 120; ++step) {
      if (g->complete(state) && rng() % 3 == 0) break;
      const auto mask = g->allowed(state);
      // The walk's mask equals feeding each token on its own.
      std::vector<int64_t> ok;
      for (int64_t t = 0; t < vocab->size(); ++t) {
        auto s2 = state;
        const bool alone = g->advance(s2, t);
        REQUIRE(alone == static_cast<bool>((*mask)[static_cast<size_t>(t)]));
        if (alone) ok.push_back(t);
      }
      if (ok.empty()) break;
      // Half the time a token that closes something, so walks end.
      std::vector<int64_t> closing;
      for (int64_t t : ok)
        if (vocab->bytes(t)->find_first_of("\"}]") != std::string::npos) closing.push_back(t);
      const std::vector<int64_t>& from = !closing.empty() && rng() % 2 ? closing : ok;
      const int64_t t = from[rng() % from.size()];
      REQUIRE(g->advance(state, t));
      text += *vocab->bytes(t);
      if (g->finished(state)) break;
    }
    if (!g->complete(state)) continue;
    ++completed;
    INFO(text);
    const json j = json::parse(text, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(st_valid(j, schema));
  }
  CHECK(completed >= 10);
}

TEST_CASE("json constraint: unsupported keywords are named, and a tool call sits between its tags", "[serve][structured]") {
  const auto vocab = st_vocab({"a"});
  for (const char* kw : {"pattern", "minLength", "format", "$ref", "oneOf", "maxItems"}) {
    const json s{{"type", "object"}, {"properties", {{"p", {{"type", "string"}, {kw, "x"}}}}}};
    try {
      JsonConstraint::compile(s, vocab);
      FAIL("accepted " << kw);
    } catch (const serve::UnsupportedSchema& e) {
      CHECK(e.keyword() == kw);
      CHECK(std::string(e.what()).find(kw) != std::string::npos);
    }
  }
  const auto g = JsonConstraint::compile(json{{"enum", {1, 12}}}, vocab, "<t>", "</t>");
  CHECK(st_accepts(*g, "<t>12</t>"));
  CHECK(st_accepts(*g, "<t>1</t>"));
  CHECK_FALSE(st_accepts(*g, "<t>2</t>"));
  CHECK_FALSE(st_accepts(*g, "<t>12"));
  auto s = g->start();
  REQUIRE(g->feed(s, "<t>1</t>"));
  CHECK(g->finished(s));
}

TEST_CASE("tool calls: Hermes tags and Llama JSON parse into calls, other text stays content", "[serve][structured]") {
  const std::vector<std::string> names{"get_weather", "f"};
  auto out = serve_http::parse_tool_calls(
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
      names);
  REQUIRE(out.calls.size() == 2);
  CHECK(out.content == "Let me look.");
  CHECK(out.calls[0].name == "get_weather");
  CHECK(json::parse(out.calls[0].arguments) == json{{"city", "Oslo"}});
  CHECK(out.calls[1].arguments == "{}");
  out = serve_http::parse_tool_calls("<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}", names);
  REQUIRE(out.calls.size() == 1);
  CHECK(json::parse(out.calls[0].arguments) == json{{"x", 1}});
  out = serve_http::parse_tool_calls("{\"name\": \"unknown\", \"parameters\": {}}", names);
  CHECK(out.calls.empty());
  out = serve_http::parse_tool_calls("plain text", names);
  CHECK(out.calls.empty());
  CHECK(out.content == "plain text");
  // The conversation's tool turns reach the template: an assistant's call (arguments as an
  // object), the tool's answer with its id, and the tools themselves.
  const ChatTemplate tmpl = ChatTemplate::from_source(
      "{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% for m in messages %}{{ m.role }}:"
      "{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments.city }}{% endif %}"
      "{% if m.tool_call_id %}{{ m.tool_call_id }}={% endif %}{{ m.content }}|{% endfor %}");
  const json msgs = json::parse(R"([{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])");
  const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather"}}])");
  CHECK(serve_http::chat_prompt(msgs, &tmpl, tools) == "[get_weather]user:weather?|assistant:Oslo|tool:c1=sunny|");
  CHECK(serve_http::detect_tool_format("{{ '<tool_call>' }}") == serve_http::ToolFormat::hermes);
  CHECK(serve_http::detect_tool_format("<|python_tag|>") == serve_http::ToolFormat::llama_json);
}

TEST_CASE("engine: greedy and sampled output under a json_schema constraint parse and validate", "[serve][structured]") {
  ModelFixture f(31, 320, 64);
  const json schema = json::parse(R"({"type": "object", "properties": {
      "ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}, "none": {"type": "null"},
      "sub": {"type": "object", "properties": {"k": {"const": 7}}, "required": ["k"], "additionalProperties": false}},
      "required": ["ok", "color", "sub"], "additionalProperties": false})");
  serve::EngineConfig cfg;
  cfg.block_size = 4;
  cfg.max_model_len = 320;
  cfg.max_num_batched_tokens = 64;
  serve::Engine engine(f.model, cfg);
  serve::SamplingParams p;
  p.max_tokens = 300;
  p.stop_token_ids = f.model->config.eos_token_ids;
  p.constraint = JsonConstraint::compile(schema, serve_http::token_bytes(f.tok, f.model->config.vocab_size));
  // Greedy, and sampled at temperature 1 with a seed: both masked before the choice.
  for (const double temperature : {0.0, 1.0}) {
    p.temperature = temperature;
    p.seed = 3;
    std::vector<int64_t> out;
    serve::FinishReason why = serve::FinishReason::cancelled;
    serve::RequestCallbacks cb;
    cb.on_token = [&](int64_t t) {
      out.push_back(t);
      return true;
    };
    cb.on_finish = [&](serve::FinishReason r) { why = r; };
    engine.add_request(f.tok.encode("answer:"), p, cb);
    for (int k = 0; k < 400 && engine.has_work(); ++k) engine.step();
    CHECK(why == serve::FinishReason::stop);
    const std::string text = f.tok.decode(out, true);
    INFO("temperature " << temperature << ": " << text);
    const json j = json::parse(text, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(st_valid(j, schema));
  }
}

TEST_CASE("tpu-serve api: json_schema output validates, a required tool call parses, streamed too", "[serve][structured]") {
  ModelFixture f(47, 400, 64);
  Running r(f.model, f.tok, f.options());
  auto c = r.client();
  const json msgs = json::array({json{{"role", "user"}, {"content", "hi"}}});
  const json schema = json::parse(R"({"type": "object", "properties": {"a": {"enum": [1, 2]}, "b": {"type": "boolean"}},
      "required": ["a", "b"], "additionalProperties": false})");
  json body{{"messages", msgs}, {"temperature", 0}, {"max_tokens", 360},
            {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", schema}}}}}};
  auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(res);
  INFO(res->body);
  REQUIRE(res->status == 200);
  json j = json::parse(res->body);
  const json doc = json::parse(j["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
  REQUIRE_FALSE(doc.is_discarded());
  CHECK(st_valid(doc, schema));

  const json tools = json::array({json{{"type", "function"}, {"function", {{"name", "pick"}, {"parameters",
      {{"type", "object"}, {"properties", {{"x", {{"enum", {"up", "down"}}}}}}, {"required", {"x"}}}}}}}});
  body = json{{"messages", msgs}, {"temperature", 0}, {"max_tokens", 360}, {"tools", tools},
              {"tool_choice", {{"type", "function"}, {"function", {{"name", "pick"}}}}}};
  res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(res);
  INFO(res->body);
  REQUIRE(res->status == 200);
  j = json::parse(res->body);
  CHECK(j["choices"][0]["finish_reason"] == "tool_calls");
  const json call = j["choices"][0]["message"]["tool_calls"][0];
  CHECK(call["type"] == "function");
  CHECK(call["function"]["name"] == "pick");
  CHECK(call["id"].get<std::string>().rfind("call_", 0) == 0);
  const json args = json::parse(call["function"]["arguments"].get<std::string>());
  CHECK((args["x"] == "up" || args["x"] == "down"));

  // A Llama 3.x style template: the forced call is bare JSON with "parameters".
  {
    serve_http::ServerOptions o = f.options();
    o.chat_template = ChatTemplate::from_source(
        "{% for m in messages %}{{ m.content }}\n{% endfor %}{% if tools %}{{ '{\"name\": ..., \"parameters\": ...}' }}{% endif %}");
    Running llama(f.model, f.tok, o);
    auto lc = llama.client();
    auto lr = lc.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(lr);
    INFO(lr->body);
    REQUIRE(lr->status == 200);
    const json lj = json::parse(lr->body);
    CHECK(lj["choices"][0]["finish_reason"] == "tool_calls");
    const json lcall = lj["choices"][0]["message"]["tool_calls"][0];
    CHECK(lcall["function"]["name"] == "pick");
    const json largs = json::parse(lcall["function"]["arguments"].get<std::string>());
    CHECK((largs["x"] == "up" || largs["x"] == "down"));
  }

  body["stream"] = true;
  const Sse s = post_stream(r, "/v1/chat/completions", body.dump());
  REQUIRE(s.status == 200);
  CHECK(s.done);
  json streamed;
  std::string finish;
  for (const json& e : s.events)
    for (const json& ch : e["choices"]) {
      if (ch["delta"].contains("tool_calls")) streamed = ch["delta"]["tool_calls"][0];
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
  CHECK(finish == "tool_calls");
  CHECK(streamed["index"] == 0);
  CHECK(streamed["function"]["arguments"] == call["function"]["arguments"]);
}
