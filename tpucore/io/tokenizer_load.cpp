// Reading tokenizer.json (model, added tokens, normalizer, pre-tokenizer, post-processor, decoder)
// and tokenizer_config.json into a tpu::Tokenizer.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tpucore/core/error.h"
#include "tpucore/io/tokenizer_impl.h"
#include "sim/json_int.h"

namespace tpu {

using json = nlohmann::json;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TPU_CHECK(f.good(), "Tokenizer: cannot open {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse(const std::string& text, const std::string& src) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON ({})", src, e.what());
  }
}

bool present(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

void read_model(Tokenizer::Impl& im, const json& m, const std::string& src) {
  TPU_CHECK(m.value("type", std::string("BPE")) == "BPE", "{}: model.type '{}' is not supported (only BPE)", src,
            m.value("type", std::string()));
  TPU_CHECK(!present(m, "dropout") || (m["dropout"].is_number() && m["dropout"].get<double>() == 0.0),
            "{}: model.dropout is not supported (BPE dropout samples merges at random)", src);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    TPU_CHECK(!present(m, k) || (m[k].is_string() && m[k].get<std::string>().empty()), "{}: model.{} {} is not supported",
              src, k, m[k].dump());
  TPU_CHECK(m.contains("vocab") && m["vocab"].is_object(), "{}: model.vocab must be an object of token -> id", src);
  for (const auto& [t, id] : m["vocab"].items()) {
    const std::optional<int64_t> vid = tpu::detail::json_int(id, 0);
    TPU_CHECK(vid.has_value(), "{}: model.vocab['{}'] must be an id >= 0 in int64 range, got {}", src, t, id.dump());
    const int64_t v = *vid;
    TPU_CHECK(im.id_to_tok.emplace(v, t).second, "{}: model.vocab gives id {} to both '{}' and '{}'", src, v,
              im.id_to_tok[v], t);
    im.vocab[t] = v;
    im.max_id = std::max(im.max_id, v);
  }
  if (m.contains("ignore_merges") && m["ignore_merges"].is_boolean()) im.ignore_merges = m["ignore_merges"].get<bool>();
  if (m.contains("byte_fallback") && m["byte_fallback"].is_boolean()) im.byte_fallback = m["byte_fallback"].get<bool>();
  if (m.contains("fuse_unk") && m["fuse_unk"].is_boolean()) im.fuse_unk = m["fuse_unk"].get<bool>();
  if (present(m, "unk_token")) {
    const std::string u = m["unk_token"].get<std::string>();
    auto it = im.vocab.find(u);
    TPU_CHECK(it != im.vocab.end(), "{}: model.unk_token '{}' is not in model.vocab", src, u);
    im.unk_id = it->second;
  }
  auto id_of = [&](const std::string& t, const char* what) {
    auto it = im.vocab.find(t);
    TPU_CHECK(it != im.vocab.end(), "{}: {} '{}' is not in model.vocab", src, what, t);
    return it->second;
  };
  TPU_CHECK(m.contains("merges") && m["merges"].is_array(), "{}: model.merges must be a list", src);
  int64_t rank = 0;
  for (const auto& e : m["merges"]) {
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      TPU_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
                "{}: model.merges[{}] '{}' must be two tokens separated by one space", src, rank, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      TPU_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
                "{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"], got {}", src, rank, e.dump());
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    }
    const int64_t ia = id_of(a, "merge part"), ib = id_of(b, "merge part"), ir = id_of(a + b, "merge result");
    im.merges.emplace(std::make_pair(ia, ib), std::make_pair(rank, ir));  // a repeated pair keeps its first rank
    ++rank;
  }
}

void read_added(Tokenizer::Impl& im, const json& list, const std::string& src) {
  TPU_CHECK(list.is_array(), "{}: added_tokens must be a list", src);
  for (const auto& a : list) {
    const std::optional<int64_t> aid = a.is_object() && a.contains("id") ? tpu::detail::json_int(a["id"], 0) : std::nullopt;
    TPU_CHECK(aid.has_value() && a.contains("content") && a["content"].is_string() && !a["content"].get<std::string>().empty(),
              "{}: each added_tokens entry needs an id >= 0 (in int64 range) and a non-empty content, got {}", src,
              a.dump());
    const int64_t id = *aid;
    const std::string content = a["content"].get<std::string>();
    if (auto it = im.id_to_tok.find(id); it != im.id_to_tok.end())
      TPU_CHECK(it->second == content, "{}: added token '{}' has id {}, which model.vocab gives to '{}'", src, content, id,
                it->second);
    if (auto prev = im.added_by_id.find(id); prev != im.added_by_id.end()) {
      TPU_CHECK(im.added[prev->second].content == content, "{}: added tokens '{}' and '{}' both have id {}", src,
                im.added[prev->second].content, content, id);
      continue;  // the same token listed twice
    }
    auto flag = [&](const char* k, bool dflt) {
      if (!present(a, k)) return dflt;
      TPU_CHECK(a[k].is_boolean(), "{}: added token '{}': {} must be true or false", src, content, k);
      return a[k].get<bool>();
    };
    const bool special = flag("special", false);
    im.added.push_back({content, id, special, flag("lstrip", false), flag("rstrip", false), flag("single_word", false),
                        flag("normalized", !special)});
    im.added_by_id[id] = im.added.size() - 1;
    im.added_by_content.emplace(content, im.added.size() - 1);
    im.max_id = std::max(im.max_id, id);
  }
}

// tokenizer_config.json: special token names, add_bos_token / add_eos_token (which rebuild the
// template as Transformers' Llama and Gemma tokenizers do), clean_up_tokenization_spaces.
void read_config(Tokenizer::Impl& im, const std::string& text, const std::string& src) {
  const json c = parse(text, src);
  TPU_CHECK(c.is_object(), "{}: expected an object", src);
  auto token = [&](const char* k) -> std::optional<std::string> {
    if (!present(c, k)) return std::nullopt;
    if (c[k].is_string()) return c[k].get<std::string>();
    TPU_CHECK(c[k].is_object() && c[k].contains("content") && c[k]["content"].is_string(),
              "{}: {} must be a string or an object with a \"content\"", src, k);
    return c[k]["content"].get<std::string>();
  };
  im.bos = token("bos_token");
  im.eos = token("eos_token");
  im.pad = token("pad_token");
  auto flag = [&](const char* k) -> std::optional<bool> {
    if (!present(c, k)) return std::nullopt;
    TPU_CHECK(c[k].is_boolean(), "{}: {} must be true or false", src, k);
    return c[k].get<bool>();
  };
  im.clean_up_spaces = flag("clean_up_tokenization_spaces").value_or(false);
  // Options with which Transformers would change the tokenizer.json pipeline.
  for (const char* k : {"add_prefix_space", "split_special_tokens", "do_lower_case"})
    TPU_CHECK(!flag(k).value_or(false), "{}: {} true is not supported (the tokenizer.json pipeline is used as written)",
              src, k);
  const auto add_bos = flag("add_bos_token"), add_eos = flag("add_eos_token");
  if (!add_bos && !add_eos) return;
  tok::PostProcessor pp;
  pp.has_template = true;
  std::vector<tok::TemplateItem> a{{false, {}, 0}}, b{{false, {}, 1}};
  auto wrap = [&](bool on, const std::optional<std::string>& name, const char* what, bool front) {
    if (!on) return;
    TPU_CHECK(name.has_value(), "{}: {} is true but no {} is given", src, what, front ? "bos_token" : "eos_token");
    const auto a_id = im.added_by_content.find(*name);
    const auto v_id = im.vocab.find(*name);
    TPU_CHECK(a_id != im.added_by_content.end() || v_id != im.vocab.end(), "{}: {} '{}' is not a token of the tokenizer",
              src, front ? "bos_token" : "eos_token", *name);
    pp.special_tokens[*name] = {a_id != im.added_by_content.end() ? im.added[a_id->second].id : v_id->second};
    const tok::TemplateItem t{true, *name, 0};
    if (front) {
      a.insert(a.begin(), t);
      b.insert(b.begin(), t);
    } else {
      a.push_back(t);
      b.push_back(t);
    }
  };
  wrap(add_bos.value_or(false), im.bos, "add_bos_token", true);
  wrap(add_eos.value_or(false), im.eos, "add_eos_token", false);
  pp.single = a;
  pp.pair = a;
  pp.pair.insert(pp.pair.end(), b.begin(), b.end());
  im.post = std::move(pp);
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  const std::filesystem::path cfg = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  return from_files(path, std::filesystem::is_regular_file(cfg, ec) ? cfg.string() : std::string());
}

Tokenizer Tokenizer::from_files(const std::string& path, const std::string& config_path) {
  const std::string text = read_file(path);
  if (config_path.empty()) return from_json(text, path);
  return from_json(text, path, read_file(config_path));
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& src, const std::string& config_text) {
  const json j = parse(text, src);
  auto im = std::make_shared<Impl>();
  // Every field is checked where it is read; a value of the wrong JSON type that a check
  // missed still becomes a tpu::Error naming the file, never a JSON library exception.
  try {
    im->source = src;
    TPU_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), "{}: expected an object with a 'model' object",
              src);
    read_model(*im, j["model"], src);
    if (present(j, "added_tokens")) read_added(*im, j["added_tokens"], src);
    if (present(j, "normalizer")) im->normalizer = tok::normalizer_of(j["normalizer"], src + ": normalizer");
    if (present(j, "pre_tokenizer")) {
      im->pre = tok::pre_tokenizer_of(j["pre_tokenizer"], src + ": pre_tokenizer");
      im->byte_level = tok::ends_byte_level(*im->pre);
    }
    if (present(j, "post_processor")) tok::post_processor_of(j["post_processor"], src + ": post_processor", im->post);
    if (present(j, "decoder")) im->decoder = tok::decoder_of(j["decoder"], src + ": decoder");
    if (present(j, "truncation") || present(j, "padding"))
      fail("{}: {} is not supported (encode returns the whole sequence)", src, present(j, "truncation") ? "truncation" : "padding");
    for (size_t k = 0; k < im->added.size(); ++k) {
      const Impl::Added& a = im->added[k];
      if (!a.normalized) {
        im->raw_trie.add(a.content, static_cast<int32_t>(k));
      } else {
        std::string n = a.content;  // matched in normalized text, so normalized too
        if (im->normalizer) tok::normalize(*im->normalizer, n);
        if (!n.empty()) im->normalized_trie.add(n, static_cast<int32_t>(k));
      }
    }
    if (!config_text.empty()) read_config(*im, config_text, src + " (tokenizer_config.json)");
  } catch (const json::exception& e) {
    fail("{}: a field has the wrong type or value ({})", src, e.what());
  }
  Tokenizer t;
  t.impl_ = std::move(im);
  return t;
}

}  // namespace tpu
