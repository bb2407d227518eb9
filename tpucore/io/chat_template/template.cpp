// tpu::ChatTemplate: the tokenizer_config.json loader and the render entry point.
#include <fstream>
#include <sstream>

#include "tpucore/chat_template.h"
#include "tpucore/core/error.h"
#include "tpucore/io/chat_template/interp.h"

namespace tpu {

struct ChatTemplate::Impl {
  std::string name;
  std::string source;
  jinja::Body body;
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  std::string bos, eos;
};

namespace {

std::string token_text(const nlohmann::ordered_json& t, const std::string& key, const std::string& origin) {
  if (t.is_null()) return {};
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  fail("{}: '{}' must be a string or an AddedToken object with a 'content' string", origin, key);
}

}  // namespace

namespace {

std::shared_ptr<ChatTemplate::Impl> parse_impl(const std::string& source, const std::string& name) {
  auto impl = std::make_shared<ChatTemplate::Impl>();
  impl->name = name;
  impl->source = source;
  try {
    impl->body = jinja::parse(source);
  } catch (const Error& e) {
    fail("{}: {}", name, e.what());
  }
  return impl;
}

}  // namespace

ChatTemplate ChatTemplate::from_source(const std::string& source, const std::string& name) {
  ChatTemplate t;
  t.impl_ = parse_impl(source, name);
  return t;
}

ChatTemplate ChatTemplate::from_config_text(const std::string& json_text, const std::string& template_name,
                                            const std::string& origin) {
  nlohmann::ordered_json cfg;
  try {
    cfg = nlohmann::ordered_json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", origin, e.what());
  }
  if (!cfg.is_object()) fail("{}: the top level must be a JSON object", origin);
  if (!cfg.contains("chat_template") || cfg["chat_template"].is_null())
    fail("{}: the model has no chat template ('chat_template' is missing); give one explicitly", origin);
  const auto& ct = cfg["chat_template"];
  std::string source, name = origin + ": chat_template";
  if (ct.is_string()) {
    if (!template_name.empty() && template_name != "default")
      fail("{}: the chat template is a single string, it has no template named '{}'", origin, template_name);
    source = ct.get<std::string>();
  } else if (ct.is_array()) {
    const std::string want = template_name.empty() ? "default" : template_name;
    std::string names;
    bool found = false;
    for (const auto& t : ct) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("template") || !t["template"].is_string())
        fail("{}: each entry of 'chat_template' must be an object with 'name' and 'template' strings", origin);
      const std::string n = t["name"].get<std::string>();
      names += (names.empty() ? "" : ", ") + n;
      if (n == want && !found) {
        source = t["template"].get<std::string>();
        found = true;
      }
    }
    if (!found) fail("{}: no chat template named '{}' (the config has: {})", origin, want, names);
    name += "[" + want + "]";
  } else {
    fail("{}: 'chat_template' must be a string or a list of named templates", origin);
  }
  auto impl = parse_impl(source, name);
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
    if (!cfg.contains(key) || cfg[key].is_null()) continue;
    impl->special[key] = token_text(cfg[key], key, origin);
  }
  if (cfg.contains("additional_special_tokens") && cfg["additional_special_tokens"].is_array()) {
    auto list = nlohmann::ordered_json::array();
    for (const auto& x : cfg["additional_special_tokens"]) list.push_back(token_text(x, "additional_special_tokens", origin));
    impl->special["additional_special_tokens"] = list;
  }
  impl->bos = impl->special.value("bos_token", "");
  impl->eos = impl->special.value("eos_token", "");
  ChatTemplate t;
  t.impl_ = std::move(impl);
  return t;
}

ChatTemplate ChatTemplate::from_config_file(const std::string& path, const std::string& template_name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return from_config_text(ss.str(), template_name, path);
}

std::string ChatTemplate::render(const ChatRequest& request, const ChatTemplateLimits& limits) const {
  if (!request.messages.is_array()) fail("{}: 'messages' must be an array", impl_->name);
  if (!request.extra.is_object()) fail("{}: the extra variables must be a JSON object", impl_->name);
  jinja::Frame globals;
  jinja::add_globals(globals);
  jinja::Frame vars{{}, &globals};
  try {
    for (auto it = impl_->special.begin(); it != impl_->special.end(); ++it) vars.set(it.key(), jinja::from_json(it.value()));
    vars.set("messages", jinja::from_json(request.messages));
    vars.set("tools", jinja::from_json(request.tools));
    vars.set("documents", jinja::from_json(request.documents));
    vars.set("add_generation_prompt", jinja::Value::boolean(request.add_generation_prompt));
    for (auto it = request.extra.begin(); it != request.extra.end(); ++it) vars.set(it.key(), jinja::from_json(it.value()));
    jinja::Frame top{{}, &vars};
    jinja::Interp in;
    in.root = &top;
    in.max_output = limits.max_output;
    in.steps_left = limits.max_steps;
    std::string out;
    in.exec(impl_->body, top, out);
    if (in.ctl != jinja::Interp::Ctl::None) fail("'break' or 'continue' outside a for loop");
    return out;
  } catch (const Error& e) {
    fail("{}: {}", impl_->name, e.what());
  }
}

const std::string& ChatTemplate::source() const { return impl_->source; }
const std::string& ChatTemplate::bos_token() const { return impl_->bos; }
const std::string& ChatTemplate::eos_token() const { return impl_->eos; }
const nlohmann::ordered_json& ChatTemplate::special_tokens() const { return impl_->special; }

}  // namespace tpu
