// Pre-tokenizers (ByteLevel, Split, Metaspace, Sequence), decoders (ByteLevel, Metaspace,
// ByteFallback, Fuse, Strip, Replace, Sequence) and post-processors (ByteLevel,
// TemplateProcessing, Sequence) of tokenizer.json files, with Hugging Face tokenizers' rules.
#include <nlohmann/json.hpp>

#include "tpucore/core/error.h"
#include "tpucore/io/tokenizer_internal.h"
#include "sim/json_int.h"

namespace tpu::tok {

using json = nlohmann::json;

namespace {

// GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68 bytes map to
// U+0100, U+0101, ... in byte order.
struct ByteTable {
  std::string to_utf8[256];
  int from_cp[512];
  ByteTable() {
    std::fill(std::begin(from_cp), std::end(from_cp), -1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const int32_t cp = printable ? b : 256 + extra++;
      from_cp[cp] = b;
      append_utf8(to_utf8[b], cp);
    }
  }
};
const ByteTable& table() {
  static const ByteTable t;
  return t;
}

std::string type_of(const json& j, const std::string& where) {
  TPU_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), "{}: needs a \"type\", got {}", where,
            j.dump().substr(0, 80));
  return j["type"].get<std::string>();
}

Behavior behavior_of(const json& j, const std::string& where) {
  TPU_CHECK(j.contains("behavior") && j["behavior"].is_string(), "{}: Split needs a \"behavior\"", where);
  const std::string b = j["behavior"].get<std::string>();
  if (b == "Removed") return Behavior::removed;
  if (b == "Isolated") return Behavior::isolated;
  if (b == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (b == "MergedWithNext") return Behavior::merged_with_next;
  if (b == "Contiguous") return Behavior::contiguous;
  fail("{}: Split behavior '{}' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous", where,
       b);
}

PreTokenizer::Prepend prepend_of(const json& j, const std::string& where) {
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const std::string s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return PreTokenizer::always;
    if (s == "first") return PreTokenizer::first;
    if (s == "never") return PreTokenizer::never;
    fail("{}: Metaspace prepend_scheme '{}' is not always, first or never", where, s);
  }
  return j.value("add_prefix_space", true) ? PreTokenizer::always : PreTokenizer::never;
}

std::string replacement_of(const json& j, const std::string& where) {
  const std::string r = j.value("replacement", std::string("\u2581"));
  TPU_CHECK(decode_utf8(r).size() == 1, "{}: Metaspace replacement must be one character, got '{}'", where, r);
  return r;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

}  // namespace

const std::string& byte_char(uint8_t b) { return table().to_utf8[b]; }
int byte_of_char(int32_t cp) { return cp >= 0 && cp < 512 ? table().from_cp[cp] : -1; }

void Trie::add(std::string_view s, int32_t value) {
  int32_t node = 0;
  for (char ch : s) {
    auto [it, fresh] = next_.emplace(key(node, static_cast<uint8_t>(ch)), static_cast<int32_t>(value_.size()));
    if (fresh) value_.push_back(-1);
    node = it->second;
  }
  value_[static_cast<size_t>(node)] = value;
}

PreTokenizer pre_tokenizer_of(const json& j, const std::string& where) {
  const std::string type = type_of(j, where);
  PreTokenizer p;
  if (type == "ByteLevel") {
    p.kind = PreTokenizer::byte_level;
    p.add_prefix_space = j.value("add_prefix_space", true);
    p.use_regex = j.value("use_regex", true);
  } else if (type == "Split") {
    p.kind = PreTokenizer::split;
    TPU_CHECK(j.contains("pattern"), "{}: Split needs a \"pattern\"", where);
    p.pattern = matcher_of(j["pattern"], where + " Split");
    p.behavior = behavior_of(j, where);
    p.invert = j.value("invert", false);
  } else if (type == "Metaspace") {
    p.kind = PreTokenizer::metaspace;
    p.replacement = replacement_of(j, where);
    p.prepend = prepend_of(j, where);
    p.metaspace_split = j.value("split", true);
  } else if (type == "Sequence") {
    TPU_CHECK(j.contains("pretokenizers") && j["pretokenizers"].is_array(), "{}: Sequence needs a \"pretokenizers\" list",
              where);
    for (const auto& q : j["pretokenizers"]) p.seq.push_back(pre_tokenizer_of(q, where));
    for (size_t k = 0; k + 1 < p.seq.size(); ++k)
      TPU_CHECK(!ends_byte_level(p.seq[k]), "{}: a ByteLevel step must be the last of the Sequence", where);
  } else {
    fail("{}: pre_tokenizer type '{}' is not supported (ByteLevel, Split, Metaspace, Sequence)", where, type);
  }
  return p;
}

bool ends_byte_level(const PreTokenizer& p) {
  if (p.kind == PreTokenizer::byte_level) return true;
  return p.kind == PreTokenizer::sequence && !p.seq.empty() && ends_byte_level(p.seq.back());
}

void pre_tokenize(const PreTokenizer& p, std::vector<Piece>& pieces) {
  if (p.kind == PreTokenizer::sequence) {
    for (const PreTokenizer& q : p.seq) pre_tokenize(q, pieces);
    return;
  }
  std::vector<Piece> out;
  auto cut = [&](const Piece& pc, const std::vector<std::pair<size_t, size_t>>& parts) {
    for (const auto& [b, e] : parts) out.push_back({pc.text.substr(b, e - b), pc.at_start && b == 0});
  };
  for (Piece& pc : pieces) {
    switch (p.kind) {
      case PreTokenizer::byte_level:
        if (p.add_prefix_space && !starts_with(pc.text, " ")) pc.text = " " + pc.text;
        if (!p.use_regex) {
          out.push_back(std::move(pc));
        } else {
          for (auto v : split_pieces(pc.text, Pattern::gpt2))
            out.push_back({std::string(v), pc.at_start && v.data() == pc.text.data()});
        }
        break;
      case PreTokenizer::split:
        cut(pc, apply_behavior(find_matches(p.pattern, pc.text), p.behavior, p.invert));
        break;
      case PreTokenizer::metaspace: {
        std::string t;
        for (char ch : pc.text) {
          if (ch == ' ') t += p.replacement;
          else t += ch;
        }
        if (!starts_with(t, p.replacement) &&
            (p.prepend == PreTokenizer::always || (p.prepend == PreTokenizer::first && pc.at_start)))
          t = p.replacement + t;
        Piece np{std::move(t), pc.at_start};
        if (!p.metaspace_split) {
          out.push_back(std::move(np));
        } else {
          Matcher m;
          m.literal = p.replacement;
          cut(np, apply_behavior(find_matches(m, np.text), Behavior::merged_with_next, false));
        }
        break;
      }
      case PreTokenizer::sequence:
        break;
    }
  }
  std::erase_if(out, [](const Piece& q) { return q.text.empty(); });
  pieces.swap(out);
}

Decoder decoder_of(const json& j, const std::string& where) {
  const std::string type = type_of(j, where);
  Decoder d;
  if (type == "ByteLevel") {
    d.kind = Decoder::byte_level;
  } else if (type == "Metaspace") {
    d.kind = Decoder::metaspace;
    d.content = replacement_of(j, where);
    d.prepend = prepend_of(j, where) != PreTokenizer::never;
  } else if (type == "ByteFallback") {
    d.kind = Decoder::byte_fallback;
  } else if (type == "Fuse") {
    d.kind = Decoder::fuse;
  } else if (type == "Strip") {
    d.kind = Decoder::strip;
    TPU_CHECK(j.contains("content") && j["content"].is_string() && decode_utf8(j["content"].get<std::string>()).size() == 1,
              "{}: Strip needs a one-character \"content\"", where);
    d.content = j["content"].get<std::string>();
    const auto a = tpu::detail::json_int(j.value("start", json(0)), 0), b = tpu::detail::json_int(j.value("stop", json(0)), 0);
    TPU_CHECK(a && b, "{}: Strip start / stop must be counts >= 0", where);
    d.start = *a;
    d.stop = *b;
  } else if (type == "Replace") {
    d.kind = Decoder::replace;
    TPU_CHECK(j.contains("pattern") && j["pattern"].is_object() && j["pattern"].contains("String") &&
                  j["pattern"]["String"].is_string() && j.contains("content") && j["content"].is_string(),
              "{}: Replace decoder needs a {{\"String\": ...}} pattern (a Regex one is not supported) and a content",
              where);
    d.pattern = j["pattern"]["String"].get<std::string>();
    d.content = j["content"].get<std::string>();
    TPU_CHECK(!d.pattern.empty(), "{}: Replace decoder pattern is empty", where);
  } else if (type == "Sequence") {
    TPU_CHECK(j.contains("decoders") && j["decoders"].is_array(), "{}: Sequence needs a \"decoders\" list", where);
    d.kind = Decoder::sequence;
    for (const auto& q : j["decoders"]) d.seq.push_back(decoder_of(q, where));
  } else {
    fail("{}: decoder type '{}' is not supported (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence)",
         where, type);
  }
  return d;
}

std::vector<std::string> decode_chain(const Decoder& d, std::vector<std::string> tokens) {
  switch (d.kind) {
    case Decoder::none:
      return tokens;
    case Decoder::byte_level: {
      // Each token's characters back to bytes; a token with a character outside the table
      // stays as written. The bytes are kept exactly (invalid UTF-8 included).
      std::string out;
      for (const std::string& t : tokens) {
        std::string bytes;
        bool ok = true;
        for (const Codepoint& c : decode_utf8(t)) {
          const int b = byte_of_char(c.cp);
          if (b < 0) {
            ok = false;
            break;
          }
          bytes += static_cast<char>(b);
        }
        out += ok ? bytes : t;
      }
      return {out};
    }
    case Decoder::metaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        std::string t;
        for (const Span& s : find_matches(Matcher{d.content, Pattern::none, nullptr}, tokens[i]))
          t += s.match ? std::string(" ") : tokens[i].substr(s.begin, s.end - s.begin);
        if (i == 0 && d.prepend && starts_with(t, " ")) t.erase(0, 1);
        tokens[i] = std::move(t);
      }
      return tokens;
    case Decoder::byte_fallback: {
      std::vector<std::string> out;
      std::string bytes;
      auto flush = [&] {
        if (bytes.empty()) return;
        bool valid = true;
        for (const Codepoint& c : decode_utf8(bytes)) valid = valid && c.cp >= 0;
        if (valid) out.push_back(bytes);
        else
          for (size_t k = 0; k < bytes.size(); ++k) out.emplace_back("\xef\xbf\xbd");  // U+FFFD per byte
        bytes.clear();
      };
      for (std::string& t : tokens) {
        auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); };
        if (t.size() == 6 && starts_with(t, "<0x") && t[5] == '>' && hex(t[3]) && hex(t[4])) {
          bytes += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      return out;
    }
    case Decoder::fuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      return {all};
    }
    case Decoder::strip:
      for (std::string& t : tokens) {
        const auto cps = decode_utf8(t);
        size_t b = 0, e = cps.size();
        const std::string& c = d.content;
        auto is = [&](size_t k) { return t.compare(cps[k].byte, cps[k].len, c) == 0; };
        while (b < e && b < static_cast<size_t>(d.start) && is(b)) ++b;
        while (e > b && cps.size() - e < static_cast<size_t>(d.stop) && is(e - 1)) --e;
        t = b == e ? std::string() : t.substr(cps[b].byte, cps[e - 1].byte + cps[e - 1].len - cps[b].byte);
      }
      return tokens;
    case Decoder::replace:
      for (std::string& t : tokens) {
        std::string r;
        for (const Span& s : find_matches(Matcher{d.pattern, Pattern::none, nullptr}, t))
          r += s.match ? d.content : t.substr(s.begin, s.end - s.begin);
        t = std::move(r);
      }
      return tokens;
    case Decoder::sequence:
      for (const Decoder& q : d.seq) tokens = decode_chain(q, std::move(tokens));
      return tokens;
  }
  return tokens;
}

void post_processor_of(const json& j, const std::string& where, PostProcessor& out) {
  const std::string type = type_of(j, where);
  if (type == "ByteLevel") return;  // changes offsets only
  if (type == "Sequence") {
    TPU_CHECK(j.contains("processors") && j["processors"].is_array(), "{}: Sequence needs a \"processors\" list", where);
    for (const auto& q : j["processors"]) post_processor_of(q, where, out);
    return;
  }
  TPU_CHECK(type == "TemplateProcessing", "{}: post_processor type '{}' is not supported (TemplateProcessing, ByteLevel, "
            "Sequence)", where, type);
  TPU_CHECK(!out.has_template, "{}: more than one TemplateProcessing", where);
  out.has_template = true;
  auto items = [&](const char* key, std::vector<TemplateItem>& dst) {
    TPU_CHECK(j.contains(key) && j[key].is_array(), "{}: TemplateProcessing needs a \"{}\" list", where, key);
    for (const auto& it : j[key]) {
      if (it.contains("SpecialToken")) {
        const json& s = it["SpecialToken"];
        TPU_CHECK(s.contains("id") && s["id"].is_string(), "{}: {} SpecialToken needs an \"id\"", where, key);
        dst.push_back({true, s["id"].get<std::string>(), 0});
      } else {
        TPU_CHECK(it.contains("Sequence") && it["Sequence"].contains("id") && it["Sequence"]["id"].is_string(),
                  "{}: {} items must be SpecialToken or Sequence, got {}", where, key, it.dump().substr(0, 80));
        const std::string id = it["Sequence"]["id"].get<std::string>();
        TPU_CHECK(id == "A" || id == "B", "{}: {} Sequence id must be A or B, got '{}'", where, key, id);
        dst.push_back({false, {}, id == "A" ? 0 : 1});
      }
    }
  };
  items("single", out.single);
  items("pair", out.pair);
  TPU_CHECK(j.contains("special_tokens") && j["special_tokens"].is_object(),
            "{}: TemplateProcessing needs a \"special_tokens\" object", where);
  for (const auto& [name, s] : j["special_tokens"].items()) {
    TPU_CHECK(s.is_object() && s.contains("ids") && s["ids"].is_array(), "{}: special_tokens['{}'] needs \"ids\"", where,
              name);
    std::vector<int64_t> ids;
    for (const auto& v : s["ids"]) {
      const auto id = tpu::detail::json_int(v, 0);
      TPU_CHECK(id.has_value(), "{}: special_tokens['{}'].ids must be ids >= 0", where, name);
      ids.push_back(*id);
    }
    out.special_tokens[name] = std::move(ids);
  }
  for (const auto* list : {&out.single, &out.pair})
    for (const TemplateItem& it : *list)
      TPU_CHECK(!it.special || out.special_tokens.count(it.token), "{}: template token '{}' is not in special_tokens",
                where, it.token);
}

}  // namespace tpu::tok
