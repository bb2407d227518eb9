#include "logprobs.h"

namespace tpu::serve_http {

using nlohmann::json;

std::string token_text(const Tokenizer& tok, int64_t id) {
  try {
    return tok.decode({id}, /*skip_special=*/false);
  } catch (const Error&) {
    return {};  // an id of a padded vocabulary without text
  }
}

namespace {
// The text as the response carries it: each byte that is not part of valid UTF-8 as U+FFFD
// (so keys that differ only in such bytes are one key, as the client sees them).
std::string as_sent(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}
// A completions top_logprobs entry: text as the client sees it -> logprob, best first (a later
// token of the same text does not replace the likelier one); null without alternatives.
json top_map(const Tokenizer& tok, const serve::TokenOutput& o) {
  if (o.top.empty()) return nullptr;
  json top = json::object();
  for (const auto& [id, lp] : o.top) {
    const std::string key = as_sent(token_text(tok, id));
    if (!top.contains(key)) top[key] = lp;
  }
  return top;
}

}  // namespace

json completion_logprobs(const Tokenizer& tok, const std::vector<serve::TokenOutput>& outs, size_t& offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& o : outs) {
    const std::string t = token_text(tok, o.token);
    tokens.push_back(t);
    lps.push_back(o.logprob);
    tops.push_back(top_map(tok, o));
    offsets.push_back(offset);
    offset += t.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json echo_logprobs(const Tokenizer& tok, const std::vector<int64_t>& prompt, const std::vector<serve::TokenOutput>& outs,
                   size_t& offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string t = token_text(tok, prompt[i]);
    tokens.push_back(t);
    offsets.push_back(offset);
    offset += t.size();
    if (i == 0 || i > outs.size()) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    const serve::TokenOutput& o = outs[i - 1];
    lps.push_back(o.logprob);
    tops.push_back(top_map(tok, o));
  }
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

void append_logprobs(json& a, const json& b) {
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (const auto& v : b[k]) a[k].push_back(v);
}

namespace {
json entry(const Tokenizer& tok, int64_t id, double lp) {
  const std::string t = token_text(tok, id);
  json bytes = json::array();
  for (char c : t) bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return json{{"token", t}, {"logprob", lp}, {"bytes", bytes}};
}
}  // namespace

json chat_logprobs(const Tokenizer& tok, const std::vector<serve::TokenOutput>& outs) {
  json content = json::array();
  for (const auto& o : outs) {
    json e = entry(tok, o.token, o.logprob);
    json top = json::array();
    for (const auto& [id, lp] : o.top) top.push_back(entry(tok, id, lp));
    e["top_logprobs"] = top;
    content.push_back(e);
  }
  return json{{"content", content}, {"refusal", nullptr}};
}

}  // namespace tpu::serve_http
