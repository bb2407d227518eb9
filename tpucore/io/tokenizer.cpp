// Byte-level BPE: tokenizer.json reading, merging by rank, encode and decode.
#include "tpucore/tokenizer.h"

#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "tpucore/core/error.h"
#include "tpucore/io/tokenizer_internal.h"
#include "sim/json_int.h"

namespace tpu {

using json = nlohmann::json;

namespace {

// GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68 bytes map to
// U+0100, U+0101, ... in byte order.
struct ByteTable {
  std::string to_utf8[256];
  std::unordered_map<int32_t, uint8_t> from_cp;
  ByteTable() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const int32_t cp = printable ? b : 256 + extra++;
      from_cp[cp] = static_cast<uint8_t>(b);
      std::string& s = to_utf8[b];
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {  // all below U+0800: two bytes
        s += static_cast<char>(0xc0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3f));
      }
    }
  }
};
const ByteTable& bytes() {
  static const ByteTable t;
  return t;
}

struct PairHash {
  size_t operator()(const std::pair<int64_t, int64_t>& p) const {
    return std::hash<int64_t>()(p.first * 1000003 + p.second);
  }
};

}  // namespace

std::string byte_to_unicode(uint8_t b) { return bytes().to_utf8[b]; }

struct Tokenizer::Impl {
  std::string source;
  std::unordered_map<std::string, int64_t> vocab;
  std::unordered_map<int64_t, std::string> id_to_tok;
  std::unordered_map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>, PairHash> merges;  // -> (rank, id)
  struct Added {
    std::string content;
    int64_t id;
    bool special;
  };
  std::vector<Added> added;  // longest first
  std::unordered_map<int64_t, size_t> added_by_id;
  tok::Pattern pattern = tok::Pattern::none;
  bool add_prefix_space = false, ignore_merges = false;
  int64_t max_id = -1;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache;

  int64_t id_of(const std::string& t, const char* what) const {
    auto it = vocab.find(t);
    TPU_CHECK(it != vocab.end(), "{}: {} '{}' is not in model.vocab", source, what, t);
    return it->second;
  }
  void bpe(const std::string& piece, std::vector<int64_t>& out) const;
};

void Tokenizer::Impl::bpe(const std::string& piece, std::vector<int64_t>& out) const {
  {
    std::lock_guard<std::mutex> lk(cache_mu);
    if (auto it = cache.find(piece); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::string mapped;
  for (char ch : piece) mapped += bytes().to_utf8[static_cast<uint8_t>(ch)];
  std::vector<int64_t> ids;
  if (auto it = vocab.find(mapped); ignore_merges && it != vocab.end()) {
    ids.push_back(it->second);
  } else {
    for (char ch : piece) {
      const std::string& sym = bytes().to_utf8[static_cast<uint8_t>(ch)];
      auto v = vocab.find(sym);
      TPU_CHECK(v != vocab.end(), "Tokenizer ({}): byte 0x{:02x} ('{}') has no token in model.vocab", source,
                static_cast<uint8_t>(ch), sym);
      ids.push_back(v->second);
    }
    // Merge the adjacent pair of lowest rank until none is left.
    while (ids.size() > 1) {
      int64_t best_rank = -1, best_id = 0;
      for (size_t k = 0; k + 1 < ids.size(); ++k)
        if (auto m = merges.find({ids[k], ids[k + 1]}); m != merges.end() && (best_rank < 0 || m->second.first < best_rank)) {
          best_rank = m->second.first;
          best_id = m->second.second;
        }
      if (best_rank < 0) break;
      std::vector<int64_t> next;
      for (size_t k = 0; k < ids.size(); ++k) {
        auto m = k + 1 < ids.size() ? merges.find({ids[k], ids[k + 1]}) : merges.end();
        if (m != merges.end() && m->second.first == best_rank) {
          next.push_back(best_id);
          ++k;
        } else {
          next.push_back(ids[k]);
        }
      }
      ids.swap(next);
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lk(cache_mu);
  if (cache.size() < 100000) cache.emplace(piece, std::move(ids));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TPU_CHECK(f.good(), "Tokenizer: cannot open {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_json(ss.str(), path);
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON ({})", src, e.what());
  }
  auto im = std::make_shared<Impl>();
  // Every field is checked where it is read; a value of the wrong JSON type that a check
  // missed still becomes a tpu::Error naming the file, never a JSON library exception.
  try {
    im->source = src;
    TPU_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), "{}: expected an object with a 'model' object",
              src);
    const json& m = j["model"];
    TPU_CHECK(m.value("type", std::string("BPE")) == "BPE", "{}: model.type '{}' is not supported (only BPE)", src,
              m.value("type", std::string()));
    TPU_CHECK(!m.contains("byte_fallback") || !m["byte_fallback"].is_boolean() || !m["byte_fallback"].get<bool>(),
              "{}: model.byte_fallback (sentencepiece-style BPE) is not supported; only byte-level BPE", src);
    TPU_CHECK(m.contains("vocab") && m["vocab"].is_object(), "{}: model.vocab must be an object of token -> id", src);
    for (const auto& [t, id] : m["vocab"].items()) {
      const std::optional<int64_t> vid = tpu::detail::json_int(id, 0);
      TPU_CHECK(vid.has_value(), "{}: model.vocab['{}'] must be an id >= 0 in int64 range, got {}", src, t, id.dump());
      const int64_t v = *vid;
      TPU_CHECK(im->id_to_tok.emplace(v, t).second, "{}: model.vocab gives id {} to both '{}' and '{}'", src, v,
                im->id_to_tok[v], t);
      im->vocab[t] = v;
      im->max_id = std::max(im->max_id, v);
    }
    if (m.contains("ignore_merges") && m["ignore_merges"].is_boolean()) im->ignore_merges = m["ignore_merges"].get<bool>();
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
      const int64_t ia = im->id_of(a, "merge part"), ib = im->id_of(b, "merge part"), ir = im->id_of(a + b, "merge result");
      im->merges.emplace(std::make_pair(ia, ib), std::make_pair(rank, ir));  // a repeated pair keeps its first rank
      ++rank;
    }
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      TPU_CHECK(j["added_tokens"].is_array(), "{}: added_tokens must be a list", src);
      std::unordered_map<int64_t, std::string> added_content;  // one content per id, or decode is ambiguous
      for (const auto& a : j["added_tokens"]) {
        const std::optional<int64_t> aid = a.is_object() && a.contains("id") ? tpu::detail::json_int(a["id"], 0) : std::nullopt;
        TPU_CHECK(aid.has_value() && a.contains("content") && a["content"].is_string() &&
                      !a["content"].get<std::string>().empty(),
                  "{}: each added_tokens entry needs an id >= 0 (in int64 range) and a non-empty content, got {}", src,
                  a.dump());
        const int64_t id = *aid;
        const std::string content = a["content"].get<std::string>();
        if (auto it = im->id_to_tok.find(id); it != im->id_to_tok.end())
          TPU_CHECK(it->second == content, "{}: added token '{}' has id {}, which model.vocab gives to '{}'", src, content,
                    id, it->second);
        const auto [prev, fresh] = added_content.emplace(id, content);
        TPU_CHECK(fresh || prev->second == content, "{}: added tokens '{}' and '{}' both have id {}", src, prev->second,
                  content, id);
        if (!fresh) continue;  // the same token listed twice
        im->added.push_back({content, id, a.value("special", false)});
        im->max_id = std::max(im->max_id, id);
      }
      std::stable_sort(im->added.begin(), im->added.end(),
                       [](const Impl::Added& x, const Impl::Added& y) { return x.content.size() > y.content.size(); });
      for (size_t k = 0; k < im->added.size(); ++k) im->added_by_id[im->added[k].id] = k;
    }
    TPU_CHECK(!j.contains("normalizer") || j["normalizer"].is_null(), "{}: normalizers are not supported (found {})", src,
              j.contains("normalizer") ? j["normalizer"].dump().substr(0, 80) : "");
    // The pre-tokenizer: ByteLevel, or Sequence[Split(pattern), ByteLevel(use_regex false)].
    auto byte_level = [&](const json& p, const std::string& where) {
      im->add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) im->pattern = tok::Pattern::gpt2;
      (void)where;
    };
    auto split = [&](const json& p, const std::string& where) {
      TPU_CHECK(p.contains("pattern") && p["pattern"].is_object() && p["pattern"].contains("Regex") &&
                    p["pattern"]["Regex"].is_string(),
                "{}: {} needs a pattern {{\"Regex\": ...}}", src, where);
      TPU_CHECK(p.value("behavior", std::string("Isolated")) == "Isolated" && !p.value("invert", false),
                "{}: {}: only behavior Isolated without invert is supported", src, where);
      im->pattern = tok::pattern_of(p["pattern"]["Regex"].get<std::string>(), src + " " + where);
    };
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
      const json& p = j["pre_tokenizer"];
      const std::string type = p.is_object() ? p.value("type", std::string()) : std::string();
      if (type == "ByteLevel") {
        byte_level(p, "pre_tokenizer");
      } else if (type == "Split") {
        split(p, "pre_tokenizer");
      } else if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
        for (const auto& q : p["pretokenizers"]) {
          const std::string t = q.is_object() ? q.value("type", std::string()) : std::string();
          if (t == "Split") split(q, "pre_tokenizer Split");
          else if (t == "ByteLevel") {
            const tok::Pattern keep = im->pattern;
            byte_level(q, "pre_tokenizer ByteLevel");
            if (keep != tok::Pattern::none) im->pattern = keep;  // a Split before it cut already
          } else
            fail("{}: pre_tokenizer type '{}' is not supported (ByteLevel, Split)", src, t);
        }
      } else {
        fail("{}: pre_tokenizer {} is not supported (ByteLevel, Split, Sequence of them)", src, p.dump().substr(0, 80));
      }
    }
  } catch (const json::exception& e) {
    fail("{}: a field has the wrong type or value ({})", src, e.what());
  }
  Tokenizer t;
  t.impl_ = std::move(im);
  return t;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (auto p : tok::split_pieces(text, impl_->pattern)) out.emplace_back(p);
  return out;
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  const Impl& im = *impl_;
  std::vector<int64_t> out;
  std::string buf;
  bool first = true;
  auto flush = [&](std::string_view s) {
    if (s.empty()) return;
    std::string owned;
    if (first && im.add_prefix_space && s.front() != ' ') {
      owned.reserve(s.size() + 1);
      owned.push_back(' ');
      owned.append(s);
      s = owned;
    }
    first = false;
    for (auto piece : tok::split_pieces(s, im.pattern)) im.bpe(std::string(piece), out);
  };
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const Impl::Added* hit = nullptr;
    if (allow_special)
      for (const auto& a : im.added)  // longest first
        if (text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
    if (!hit) {
      ++i;
      continue;
    }
    flush(text.substr(start, i - start));
    out.push_back(hit->id);
    first = false;
    i += hit->content.size();
    start = i;
  }
  flush(text.substr(start));
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  const Impl& im = *impl_;
  std::string out;
  for (int64_t id : ids) {
    if (auto a = im.added_by_id.find(id); a != im.added_by_id.end()) {
      const auto& t = im.added[a->second];
      if (!(skip_special && t.special)) out += t.content;
      continue;
    }
    auto it = im.id_to_tok.find(id);
    TPU_CHECK(it != im.id_to_tok.end(), "Tokenizer::decode: id {} is not in the vocabulary of {} (size {})", id,
              im.source, vocab_size());
    for (const auto& c : tok::decode_utf8(it->second)) {
      auto b = bytes().from_cp.find(c.cp);
      TPU_CHECK(c.cp >= 0 && b != bytes().from_cp.end(),
                "Tokenizer::decode: token {} ('{}') of {} has a character outside the byte-level alphabet", id,
                it->second, im.source);
      out += static_cast<char>(b->second);
    }
  }
  return out;
}

int64_t Tokenizer::vocab_size() const { return impl_->max_id + 1; }

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  if (auto it = impl_->vocab.find(std::string(token)); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int64_t id) const {
  if (auto a = impl_->added_by_id.find(id); a != impl_->added_by_id.end()) return impl_->added[a->second].content;
  auto it = impl_->id_to_tok.find(id);
  TPU_CHECK(it != impl_->id_to_tok.end(), "Tokenizer: id {} is not in the vocabulary of {}", id, impl_->source);
  return it->second;
}

bool Tokenizer::is_special(int64_t id) const {
  auto a = impl_->added_by_id.find(id);
  return a != impl_->added_by_id.end() && impl_->added[a->second].special;
}

}  // namespace tpu
