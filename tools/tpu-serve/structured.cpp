#include "structured.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <optional>
#include <random>

#include "api.h"

namespace tpu::serve_http {

using nlohmann::json;

namespace {
[[noreturn]] void st_bad_param(const std::string& param, const std::string& msg) {
  throw ApiError{400, msg, "invalid_request_error", param, ""};
}

std::string st_trim_space(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// A call object {"name", "arguments" | "parameters"} of a known function, or nothing.
std::optional<ToolCall> st_call_of(const std::string& text, const std::vector<std::string>& names) {
  const json j = json::parse(st_trim_space(text), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const std::string name = j["name"].get<std::string>();
  if (std::find(names.begin(), names.end(), name) == names.end()) return std::nullopt;
  const char* key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
  json args = key ? j[key] : json::object();
  if (args.is_string()) return ToolCall{name, args.get<std::string>()};
  return ToolCall{name, args.dump(-1, ' ', false, json::error_handler_t::replace)};
}

std::string st_call_id() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard<std::mutex> lk(mu);
  return fmt::format("call_{:016x}", gen());
}

// Compiled constraints by (vocabulary, prefix, suffix, schema), so requests with the same schema
// share one automaton and its cache of masks (the first walk of a state costs a pass over the
// vocabulary); the older half is dropped beyond 16 entries.
std::shared_ptr<const serve::JsonConstraint> compile_shared(const json& schema,
                                                           const std::shared_ptr<const serve::TokenBytes>& vocab,
                                                           const std::string& prefix = "", const std::string& suffix = "") {
  static std::mutex mu;
  static std::map<std::string, std::pair<uint64_t, std::shared_ptr<const serve::JsonConstraint>>> cache;
  static uint64_t tick = 0;
  const std::string key = fmt::format("{}\n{}\n{}\n{}", static_cast<const void*>(vocab.get()), prefix, suffix, schema.dump());
  {
    std::lock_guard<std::mutex> lk(mu);
    const auto it = cache.find(key);
    if (it != cache.end()) {
      it->second.first = ++tick;
      return it->second.second;
    }
  }
  auto g = serve::JsonConstraint::compile(schema, vocab, prefix, suffix);  // may throw UnsupportedSchema
  std::lock_guard<std::mutex> lk(mu);
  if (cache.size() >= 16) {
    std::vector<uint64_t> ticks;
    for (const auto& [k, v] : cache) ticks.push_back(v.first);
    std::nth_element(ticks.begin(), ticks.begin() + 8, ticks.end());
    const uint64_t cut = ticks[8];
    for (auto it = cache.begin(); it != cache.end();) it = it->second.first < cut ? cache.erase(it) : std::next(it);
  }
  cache[key] = {++tick, g};
  return g;
}

[[noreturn]] void st_schema_error(const std::string& param, const serve::UnsupportedSchema& e) {
  throw ApiError{400, fmt::format("'{}': {}", param, e.what()), "invalid_request_error", param,
                 "unsupported_parameter"};
}
}  // namespace

ToolFormat detect_tool_format(const std::string& src) {
  if (src.find("<tool_call>") != std::string::npos) return ToolFormat::hermes;
  if (src.find("<|python_tag|>") != std::string::npos || src.find("\"parameters\"") != std::string::npos)
    return ToolFormat::llama_json;
  return ToolFormat::hermes;
}

std::shared_ptr<const serve::TokenBytes> token_bytes(const Tokenizer& tok, int64_t vocab) {
  // A token's bytes as they appear after other text: decoded after a plain reference token and
  // the reference's own text removed (a decoder may drop a leading space at the start of a
  // text); byte-fallback pieces <0xHH> are their byte.
  const std::optional<int64_t> ref = tok.token_to_id("a");
  const std::string ref_text = ref ? tok.decode({*ref}, false) : std::string();
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(vocab));
  for (int64_t id = 0; id < vocab && id < tok.vocab_size(); ++id) {
    if (tok.is_special(id)) continue;
    try {
      const std::string piece = tok.id_to_token(id);
      if (piece.size() == 6 && piece.rfind("<0x", 0) == 0 && piece[5] == '>' && std::isxdigit(static_cast<unsigned char>(piece[3])) &&
          std::isxdigit(static_cast<unsigned char>(piece[4]))) {
        bytes[static_cast<size_t>(id)] = std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
        continue;
      }
      std::string text = ref ? tok.decode({*ref, id}, false) : tok.decode({id}, false);
      if (ref && text.rfind(ref_text, 0) == 0) text.erase(0, ref_text.size());
      else if (ref) text = tok.decode({id}, false);
      bytes[static_cast<size_t>(id)] = text;
    } catch (const Error&) {
      // an id without a token (a gap in the vocabulary): never generated under a constraint
    }
  }
  return std::make_shared<const serve::TokenBytes>(std::move(bytes));
}

ToolOutput parse_tool_calls(const std::string& text, const std::vector<std::string>& names) {
  ToolOutput out;
  // Hermes / Qwen: <tool_call>{...}</tool_call>, possibly several; the last may be unclosed.
  static const std::string open = "<tool_call>", close = "</tool_call>";
  std::string rest;
  size_t at = 0;
  while (true) {
    const size_t b = text.find(open, at);
    if (b == std::string::npos) break;
    const size_t e = text.find(close, b + open.size());
    const size_t body_end = e == std::string::npos ? text.size() : e;
    const auto call = st_call_of(text.substr(b + open.size(), body_end - b - open.size()), names);
    if (!call) break;
    rest += text.substr(at, b - at);
    out.calls.push_back(*call);
    at = e == std::string::npos ? text.size() : e + close.size();
  }
  if (!out.calls.empty()) {
    out.content = st_trim_space(rest + text.substr(std::min(at, text.size())));
    return out;
  }
  // Llama 3.x: the whole message is one JSON call, optionally after <|python_tag|>.
  std::string body = st_trim_space(text);
  if (body.rfind("<|python_tag|>", 0) == 0) body = body.substr(14);
  if (const auto call = st_call_of(body, names)) {
    out.calls.push_back(*call);
    return out;
  }
  out.content = text;
  return out;
}

Structured parse_structured(const json& j, const std::shared_ptr<const serve::TokenBytes>& vocab, ToolFormat format) {
  Structured s;
  const auto set = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  if (set("response_format")) {
    const json& rf = j["response_format"];
    const std::string type = rf.is_object() && rf.contains("type") && rf["type"].is_string() ? rf["type"].get<std::string>() : "";
    if (type == "json_object") {
      s.constraint = compile_shared(nullptr, vocab);
    } else if (type == "json_schema") {
      const json js = rf.value("json_schema", json());
      if (!js.is_object() || !js.contains("schema"))
        st_bad_param("response_format", "'response_format.json_schema' must be an object with a 'schema'");
      try {
        s.constraint = compile_shared(js["schema"], vocab);
      } catch (const serve::UnsupportedSchema& e) {
        st_schema_error("response_format", e);
      }
    } else if (type != "text") {
      st_bad_param("response_format", "'response_format.type' must be one of text, json_object, json_schema");
    }
  }
  if (!set("tools")) {
    if (set("tool_choice") && !(j["tool_choice"].is_string() && j["tool_choice"] == "none"))
      st_bad_param("tool_choice", "'tool_choice' needs 'tools'");
    return s;
  }
  if (!j["tools"].is_array()) st_bad_param("tools", "'tools' must be an array");
  if (j["tools"].empty()) return s;
  s.tools = nlohmann::ordered_json::array();
  std::vector<json> call_schemas;
  const char* args_key = format == ToolFormat::hermes ? "arguments" : "parameters";
  for (size_t i = 0; i < j["tools"].size(); ++i) {
    const json& t = j["tools"][i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object())
      st_bad_param(at, at + " must be {\"type\": \"function\", \"function\": {...}}");
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      st_bad_param(at, at + ".function.name must be a non-empty string");
    const std::string name = f["name"].get<std::string>();
    if (std::find(s.tool_names.begin(), s.tool_names.end(), name) != s.tool_names.end())
      st_bad_param(at, fmt::format("two tools are named '{}'", name));
    s.tool_names.push_back(name);
    const json params = f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"] : json{{"type", "object"}};
    call_schemas.push_back(json{{"type", "object"},
                                {"properties", {{"name", {{"const", name}}}, {args_key, params}}},
                                {"required", {"name", args_key}},
                                {"additionalProperties", false}});
    s.tools.push_back(nlohmann::ordered_json::parse(t.dump()));
  }
  if (set("parallel_tool_calls") && !j["parallel_tool_calls"].is_boolean())
    st_bad_param("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
  json choice = set("tool_choice") ? j["tool_choice"] : json("auto");
  std::vector<json> forced;
  if (choice.is_string() && choice == "none") return s;  // tools shown to the model, output is text
  if (choice.is_string() && choice == "auto") {
    s.parse_tools = true;
    return s;
  }
  if (choice.is_string() && choice == "required") {
    forced = call_schemas;
  } else if (choice.is_object() && choice.value("type", "") == "function" && choice.contains("function") &&
             choice["function"].is_object() && choice["function"].contains("name") &&
             choice["function"]["name"].is_string()) {
    const std::string name = choice["function"]["name"].get<std::string>();
    const auto it = std::find(s.tool_names.begin(), s.tool_names.end(), name);
    if (it == s.tool_names.end()) st_bad_param("tool_choice", fmt::format("tool_choice names '{}', which is not among the tools", name));
    forced.push_back(call_schemas[static_cast<size_t>(it - s.tool_names.begin())]);
  } else {
    st_bad_param("tool_choice",
              "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  if (s.constraint) st_bad_param("tool_choice", "a forced tool call cannot be combined with 'response_format'");
  s.parse_tools = true;
  const json schema = forced.size() == 1 ? forced[0] : json{{"anyOf", forced}};
  try {
    s.constraint = format == ToolFormat::hermes ? compile_shared(schema, vocab, "<tool_call>\n", "\n</tool_call>")
                                                : compile_shared(schema, vocab);
  } catch (const serve::UnsupportedSchema& e) {
    st_schema_error("tools", e);
  }
  return s;
}

bool attach_tool_calls(json& message, const std::string& text, const std::vector<std::string>& names, bool streamed) {
  const ToolOutput out = parse_tool_calls(text, names);
  if (out.calls.empty()) return false;
  message["content"] = out.content.empty() ? json(nullptr) : json(out.content);
  json calls = json::array();
  for (size_t i = 0; i < out.calls.size(); ++i) {
    json c{{"id", st_call_id()}, {"type", "function"}, {"function", {{"name", out.calls[i].name}, {"arguments", out.calls[i].arguments}}}};
    if (streamed) c["index"] = i;
    calls.push_back(c);
  }
  message["tool_calls"] = calls;
  return true;
}

}  // namespace tpu::serve_http
