#include "api.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <set>

#include "sim/json_int.h"

namespace tpu::serve_http {

using nlohmann::json;

std::string error_body(const ApiError& e) {
  json j{{"error", {{"message", e.message}, {"type", e.type}}}};
  j["error"]["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  j["error"]["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return j.dump();
}

namespace {
[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError{400, msg, "invalid_request_error", param, ""}; }
[[noreturn]] void unsupported(const std::string& param, const std::string& why) {
  throw ApiError{400, fmt::format("'{}' is not supported by this server{}", param, why), "invalid_request_error", param,
                 "unsupported_parameter"};
}

// The body's fields: those read below, those accepted because they do not change the result,
// and those accepted only at a value that changes nothing. Any other field is a 400 naming it.
const std::set<std::string>& known_fields(bool chat) {
  static const std::set<std::string> common{
      "model", "max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop", "stream",
      "stream_options", "n", "frequency_penalty", "presence_penalty", "logit_bias", "min_tokens", "ignore_eos",
      "stop_token_ids", "logprobs",
      // No effect on the result: identification, storage and routing hints.
      "user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"};
  static const std::set<std::string> chat_fields = [] {
    std::set<std::string> s = common;
    s.insert({"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools", "tool_choice",
              "functions", "function_call", "parallel_tool_calls"});
    return s;
  }();
  static const std::set<std::string> completion_fields = [] {
    std::set<std::string> s = common;
    s.insert({"prompt", "echo", "best_of", "suffix"});
    return s;
  }();
  return chat ? chat_fields : completion_fields;
}

// Fields read elsewhere (structured.h) or refused: any value but the neutral one is a 400.
void refuse_unsupported(const json& j, bool chat) {
  for (const auto& [k, v] : j.items())
    if (!known_fields(chat).count(k))
      throw ApiError{400, fmt::format("Unrecognized request argument supplied: '{}' (not supported by this server)", k),
                     "invalid_request_error", k, "unsupported_parameter"};
  const auto set = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  if (set("functions") && !(j["functions"].is_array() && j["functions"].empty()))
    unsupported("functions", " (the deprecated form; use 'tools')");
  if (set("function_call") && !(j["function_call"].is_string() && j["function_call"] == "none"))
    unsupported("function_call", " (the deprecated form; use 'tool_choice')");
  if (set("suffix") && !(j["suffix"].is_string() && j["suffix"].get<std::string>().empty()))
    unsupported("suffix", " (no insertion)");
}

uint64_t fresh_seed() {
  static std::mutex mu;
  static std::mt19937_64 gen{[] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }()};
  std::lock_guard<std::mutex> lk(mu);
  return gen();
}

double number(const json& j, const char* key, double dflt, double lo, double hi) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_number()) bad(key, fmt::format("'{}' must be a number", key));
  const double v = j[key].get<double>();
  if (!(v >= lo && v <= hi)) bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v));
  return v;
}
int64_t integer(const json& j, const char* key, int64_t dflt, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_number_integer()) bad(key, fmt::format("'{}' must be an integer", key));
  const std::optional<int64_t> v = tpu::detail::json_int(j[key], lo, hi);
  if (!v) bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, j[key].dump()));
  return *v;
}
bool boolean(const json& j, const char* key, bool dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) bad(key, fmt::format("'{}' must be a boolean", key));
  return j[key].get<bool>();
}
std::string message_text(const json& m, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  if (!m.contains("content") || m["content"].is_null()) bad(param, param + " is missing");
  const json& c = m["content"];
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(param, param + " must be a string or an array of text parts");
  std::string s;
  for (const json& part : c) {
    if (part.is_object() && (part.value("type", "") == "image_url" || part.value("type", "") == "image"))
      bad(param, param + ": image inputs are not supported (the model runs as a text-only language model)");
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      bad(param, param + ": only parts {\"type\": \"text\", \"text\": ...} are supported");
    s += part["text"].get<std::string>();
  }
  return s;
}
}  // namespace

std::string chat_prompt(const json& messages, const ChatTemplate* tmpl, const nlohmann::ordered_json& tools) {
  if (!tmpl)
    bad("messages", "this model has no chat template (its tokenizer_config.json has no 'chat_template'); "
                    "start tpu-serve with --chat-template FILE");
  ChatRequest req;
  req.add_generation_prompt = true;
  req.tools = tools;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) bad(fmt::format("messages[{}]", i), fmt::format("messages[{}] must be an object", i));
    if (!m.contains("role") || !m["role"].is_string())
      bad(fmt::format("messages[{}].role", i), fmt::format("messages[{}].role must be a string", i));
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")
      bad(fmt::format("messages[{}].role", i),
          fmt::format("messages[{}].role '{}' is not one of system, developer, user, assistant, tool", i, role));
    nlohmann::ordered_json msg{{"role", role}};
    const bool calls = role == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array();
    msg["content"] = calls && (!m.contains("content") || m["content"].is_null()) ? "" : message_text(m, i);
    if (calls) {
      // As Transformers' templates read them: arguments as an object when they parse.
      nlohmann::ordered_json tc = nlohmann::ordered_json::parse(m["tool_calls"].dump());
      for (auto& c : tc)
        if (c.contains("function") && c["function"].contains("arguments") && c["function"]["arguments"].is_string()) {
          const auto args = nlohmann::ordered_json::parse(c["function"]["arguments"].get<std::string>(), nullptr, false);
          if (!args.is_discarded()) c["function"]["arguments"] = args;
        }
      msg["tool_calls"] = tc;
    }
    for (const char* k : {"tool_call_id", "name"})
      if (m.contains(k) && m[k].is_string()) msg[k] = m[k];
    req.messages.push_back(msg);
  }
  try {
    return tmpl->render(req);
  } catch (const Error& e) {
    bad("messages", e.what());  // e.g. the template's raise_exception: roles must alternate
  }
}

CompletionRequest parse_request(const std::string& body, bool chat, const ModelInfo& info) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    bad("", fmt::format("the body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) bad("", "the body must be a JSON object");
  refuse_unsupported(j, chat);
  CompletionRequest r;
  r.chat = chat;
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) bad("model", "'model' must be a string");
    if (j["model"].get<std::string>() != info.name)
      throw ApiError{404, fmt::format("The model '{}' does not exist; this server serves '{}'",
                                      j["model"].get<std::string>(), info.name),
                     "invalid_request_error", "model", "model_not_found"};
  }
  r.n = integer(j, "n", 1, 1, 16);
  r.best_of = chat ? r.n : integer(j, "best_of", r.n, 1, 16);
  if (r.best_of < r.n) bad("best_of", fmt::format("'best_of' ({}) must be at least 'n' ({})", r.best_of, r.n));
  const Tokenizer& tok = *info.tokenizer;
  try {
    if (chat) {
      if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
        bad("messages", "'messages' must be a non-empty array");
      // As Transformers' apply_chat_template: the template writes BOS and the role tokens itself,
      // so the rendered text is encoded without adding special tokens.
      EncodeOptions no_added;
      no_added.add_special_tokens = false;
      const Structured st = parse_structured(j, info.token_bytes, info.tool_format);
      r.params.constraint = st.constraint;
      r.parse_tools = st.parse_tools;
      r.tool_names = st.tool_names;
      r.prompt = tok.encode(chat_prompt(j["messages"], info.chat_template, st.tools), no_added);
    } else {
      if (!j.contains("prompt")) bad("prompt", "'prompt' is required");
      const json& p = j["prompt"];
      if (p.is_string()) {
        r.prompt_text = p.get<std::string>();
        r.prompt = tok.encode(r.prompt_text);
      } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
        r.prompt_text = p[0].get<std::string>();
        r.prompt = tok.encode(r.prompt_text);
      } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
        for (const json& t : p) {
          if (!t.is_number_integer()) bad("prompt", "a token-id prompt must hold only integers");
          const std::optional<int64_t> id = tpu::detail::json_int(t, 0);
          if (!id) bad("prompt", fmt::format("token id {} is outside the vocabulary of {}", t.dump(), tok.vocab_size()));
          r.prompt.push_back(*id);
        }
      } else {
        bad("prompt", "'prompt' must be a string, one string in an array, or an array of token ids");
      }
    }
  } catch (const Error& e) {  // the tokenizer's or the chat template's complaint
    bad(chat ? "messages" : "prompt", e.what());
  }
  if (r.prompt.empty()) bad(chat ? "messages" : "prompt", "the prompt is empty after tokenization");
  const int64_t vocab = tok.vocab_size();
  for (int64_t t : r.prompt)
    if (t < 0 || t >= vocab) bad("prompt", fmt::format("token id {} is outside the vocabulary of {}", t, vocab));
  const auto n = static_cast<int64_t>(r.prompt.size());
  if (n >= info.max_model_len)
    bad(chat ? "messages" : "prompt",
        fmt::format("This model's maximum context length is {} tokens; the prompt has {} tokens (at least one "
                    "must be left to generate)",
                    info.max_model_len, n));
  const int64_t room = info.max_model_len - n;
  const char* max_key = chat && j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const int64_t max_tokens = integer(j, max_key, chat ? room : std::min<int64_t>(16, room), 1, int64_t{1} << 40);
  if (max_tokens > room)
    throw ApiError{400,
                   fmt::format("This model's maximum context length is {} tokens; you requested {} tokens ({} in "
                               "the prompt, {} to generate)",
                               info.max_model_len, n + max_tokens, n, max_tokens),
                   "invalid_request_error", max_key, "context_length_exceeded"};
  r.params.max_tokens = max_tokens;
  r.params.temperature = number(j, "temperature", 1.0, 0.0, 2.0);  // 0: greedy
  r.params.top_p = number(j, "top_p", 1.0, 0.0, 1.0);
  if (r.params.top_p <= 0) bad("top_p", "'top_p' must be above 0");
  const int64_t top_k = integer(j, "top_k", 0, -1, int64_t{1} << 31);
  r.params.top_k = top_k < 0 ? 0 : top_k;
  r.params.repetition_penalty = number(j, "repetition_penalty", 1.0, 1e-3, 100.0);
  // Any integer seeds: a negative one as its two's complement, one past INT64_MAX as it is.
  if (j.contains("seed") && j["seed"].is_number_unsigned()) r.params.seed = j["seed"].get<uint64_t>();
  else if (j.contains("seed") && !j["seed"].is_null())
    r.params.seed = static_cast<uint64_t>(integer(j, "seed", 0, INT64_MIN, INT64_MAX));
  else r.params.seed = fresh_seed();  // unseeded requests differ
  r.params.frequency_penalty = number(j, "frequency_penalty", 0.0, -2.0, 2.0);
  r.params.presence_penalty = number(j, "presence_penalty", 0.0, -2.0, 2.0);
  if (j.contains("logit_bias") && !j["logit_bias"].is_null()) {
    if (!j["logit_bias"].is_object()) bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (const auto& [k, v] : j["logit_bias"].items()) {
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(k, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != k.size() || k.empty() || id < 0 || id >= tok.vocab_size())
        bad("logit_bias", fmt::format("logit_bias key '{}' is not a token id of the vocabulary of {}", k, tok.vocab_size()));
      if (!v.is_number()) bad("logit_bias", fmt::format("logit_bias['{}'] must be a number", k));
      // As OpenAI documents: values in [-100, 100] (a larger one is clamped).
      r.params.logit_bias[id] = std::clamp(v.get<double>(), -100.0, 100.0);
    }
  }
  if (!boolean(j, "ignore_eos", false)) r.params.stop_token_ids = info.eos;
  if (j.contains("stop_token_ids") && !j["stop_token_ids"].is_null()) {
    if (!j["stop_token_ids"].is_array()) bad("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    for (const json& t : j["stop_token_ids"]) {
      const std::optional<int64_t> id = t.is_number_integer() ? tpu::detail::json_int(t, 0, vocab - 1) : std::nullopt;
      if (!id) bad("stop_token_ids", fmt::format("stop token id {} is outside the vocabulary of {}", t.dump(), vocab));
      r.params.stop_token_ids.push_back(*id);
    }
  }
  r.params.min_tokens = integer(j, "min_tokens", 0, 0, max_tokens);
  if (chat) {
    const bool lp = boolean(j, "logprobs", false);
    const int64_t top = integer(j, "top_logprobs", 0, 0, 20);
    if (!lp && j.contains("top_logprobs") && !j["top_logprobs"].is_null())
      bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.logprobs = lp ? top : -1;
  } else {
    r.logprobs = integer(j, "logprobs", -1, 0, 20);
    r.echo = boolean(j, "echo", false);
    // A token-id prompt's text (the ids are checked above).
    if (r.echo && !j["prompt"].is_string() && !(j["prompt"].is_array() && j["prompt"][0].is_string())) {
      try {
        r.prompt_text = tok.decode(r.prompt, /*skip_special=*/false);
      } catch (const Error& e) {
        bad("prompt", e.what());
      }
    }
  }
  // best_of ranks sequences by their summed log-probabilities: the engine reports them.
  r.params.logprobs = r.best_of > r.n ? std::max<int64_t>(r.logprobs, 0) : r.logprobs;
  // echo with logprobs: the prompt's too (the server asks for them on the first sequence only).
  r.params.prompt_logprobs = r.echo ? r.logprobs : -1;
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const json& x : s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of up to 4 strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of up to 4 strings");
    }
    for (const auto& x : r.stop)
      if (x.empty()) bad("stop", "stop strings must not be empty");
  }
  r.params.stop = r.stop;
  r.stream = boolean(j, "stream", false);
  if (r.stream && r.best_of > r.n) bad("best_of", "'best_of' above 'n' cannot be streamed");
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    if (!j["stream_options"].is_object()) bad("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(j["stream_options"], "include_usage", false);
  }
  return r;
}

uint64_t choice_seed(uint64_t seed, int64_t i) {
  if (i == 0) return seed;
  // splitmix64 of the seed and the choice index: choices get unrelated streams.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

size_t utf8_complete(const std::string& s) {
  // Look back over at most 3 trailing bytes for the lead byte of an unfinished sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? n - back : n;
  }
  return n;
}

}  // namespace tpu::serve_http
