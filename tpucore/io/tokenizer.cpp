// Encoding (added-token split, normalization, pre-tokenization, BPE by a priority queue over pair
// ranks, post-processing) and decoding of tpu::Tokenizer.
#include <unicode/uchar.h>

#include <algorithm>
#include <queue>

#include "tpucore/core/error.h"
#include "tpucore/io/tokenizer_impl.h"

namespace tpu {

std::string byte_to_unicode(uint8_t b) { return tok::byte_char(b); }

namespace {

bool is_word_char(int32_t c) {
  return c == '_' || (c >= 0 && (U_GET_GC_MASK(c) & (U_GC_L_MASK | U_GC_N_MASK | U_GC_M_MASK)) != 0);
}
bool is_space(int32_t c) { return c >= 0 && u_isUWhiteSpace(c); }

// The code point that ends s (-1 if none or invalid).
int32_t last_cp(std::string_view s) {
  if (s.empty()) return -1;
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xc0) == 0x80 && s.size() - k < 4) --k;
  const auto cps = tok::decode_utf8(s.substr(k));
  return cps.empty() ? -1 : cps.back().cp;
}
int32_t first_cp(std::string_view s) {
  const auto cps = tok::decode_utf8(s.substr(0, std::min<size_t>(4, s.size())));
  return cps.empty() ? -1 : cps.front().cp;
}

struct Seg {
  std::string text;
  int64_t added;  // the added token's id, or -1 for text
  bool at_start;
};

}  // namespace

void Tokenizer::Impl::bpe(const std::string& piece, std::vector<int64_t>& out) const {
  {
    std::lock_guard<std::mutex> lk(cache_mu);
    if (auto it = cache.find(piece); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::string word;
  if (byte_level) {
    word.reserve(piece.size() * 2);
    for (char ch : piece) word += tok::byte_char(static_cast<uint8_t>(ch));
  } else {
    word = piece;
  }
  std::vector<int64_t> ids;
  if (auto it = vocab.find(word); ignore_merges && it != vocab.end()) {
    ids.push_back(it->second);
  } else {
    // One symbol per character; a character outside the vocabulary becomes its bytes' <0xXX>
    // tokens (byte_fallback) or the unknown token.
    std::vector<bool> unk;
    for (const tok::Codepoint& c : tok::decode_utf8(word)) {
      const std::string ch = word.substr(c.byte, c.len);
      if (auto v = vocab.find(ch); v != vocab.end()) {
        ids.push_back(v->second);
        unk.push_back(false);
        continue;
      }
      if (byte_fallback) {
        std::vector<int64_t> bs;
        for (char b : ch) {
          char name[8];
          std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned>(static_cast<uint8_t>(b)));
          if (auto v = vocab.find(name); v != vocab.end()) bs.push_back(v->second);
        }
        if (bs.size() == ch.size()) {
          ids.insert(ids.end(), bs.begin(), bs.end());
          unk.insert(unk.end(), bs.size(), false);
          continue;
        }
      }
      if (byte_level && !unk_id)
        fail("Tokenizer ({}): byte 0x{:02x} ('{}') has no token in model.vocab", source, tok::byte_of_char(c.cp), ch);
      TPU_CHECK(unk_id.has_value(), "Tokenizer ({}): character '{}' has no token in model.vocab and model.unk_token is not set",
                source, ch);
      if (fuse_unk && !unk.empty() && unk.back()) continue;
      ids.push_back(*unk_id);
      unk.push_back(true);
    }
    // Merge the pair of lowest rank (leftmost first) until none is left.
    const int n = static_cast<int>(ids.size());
    std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
    std::vector<char> alive(static_cast<size_t>(n), 1);
    for (int k = 0; k < n; ++k) prev[static_cast<size_t>(k)] = k - 1, next[static_cast<size_t>(k)] = k + 1 < n ? k + 1 : -1;
    struct Cand {
      int64_t rank;
      int pos;
      int64_t new_id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int a) {
      if (a < 0) return;
      const int b = next[static_cast<size_t>(a)];
      if (b < 0) return;
      if (auto m = merges.find({ids[static_cast<size_t>(a)], ids[static_cast<size_t>(b)]}); m != merges.end())
        heap.push({m->second.first, a, m->second.second});
    };
    for (int k = 0; k + 1 < n; ++k) push(k);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      const auto a = static_cast<size_t>(c.pos);
      if (!alive[a] || next[a] < 0) continue;
      const auto b = static_cast<size_t>(next[a]);
      auto m = merges.find({ids[a], ids[b]});
      if (m == merges.end() || m->second.second != c.new_id) continue;  // stale
      ids[a] = c.new_id;
      alive[b] = 0;
      next[a] = next[b];
      if (next[a] >= 0) prev[static_cast<size_t>(next[a])] = c.pos;
      push(prev[a]);
      push(c.pos);
    }
    std::vector<int64_t> merged;
    for (int k = n > 0 ? 0 : -1; k >= 0; k = next[static_cast<size_t>(k)]) merged.push_back(ids[static_cast<size_t>(k)]);
    ids.swap(merged);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lk(cache_mu);
  if (cache.size() < 100000 && piece.size() < 4096) cache.emplace(piece, std::move(ids));
}

std::vector<int64_t> Tokenizer::Impl::encode_text(std::string_view text, const EncodeOptions& o) const {
  auto matched = [&](const Added& a) {
    if (!a.special || o.special == EncodeOptions::Special::all) return true;
    if (o.special == EncodeOptions::Special::none) return false;
    return std::find(o.allowed_special.begin(), o.allowed_special.end(), a.content) != o.allowed_special.end();
  };
  // Splits s around the added tokens of `trie` (leftmost-longest matches; one that its flags or
  // the options reject stays text).
  auto split = [&](const tok::Trie& trie, std::string_view s, bool at_start, std::vector<Seg>& out) {
    size_t from = 0, i = 0;
    while (i < s.size() && !trie.empty()) {
      const auto [len, v] = trie.longest(s, i);
      if (len == 0) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + len;
      i = stop;
      const Added& a = added[static_cast<size_t>(v)];
      if (!matched(a)) continue;
      if (a.single_word && (is_word_char(last_cp(s.substr(0, start))) || is_word_char(first_cp(s.substr(stop))))) continue;
      if (a.lstrip) {
        size_t k = start;
        for (int32_t c; k > from && is_space(c = last_cp(s.substr(0, k)));) {
          std::string u;
          tok::append_utf8(u, c);
          k -= u.size();
        }
        start = std::max(k, from);
      }
      if (a.rstrip) {
        for (int32_t c; stop < s.size() && is_space(c = first_cp(s.substr(stop)));) {
          std::string u;
          tok::append_utf8(u, c);
          stop += u.size();
        }
        i = stop;
      }
      if (from < start) out.push_back({std::string(s.substr(from, start - from)), -1, at_start && from == 0});
      out.push_back({{}, a.id, false});
      from = stop;
    }
    if (from < s.size()) out.push_back({std::string(s.substr(from)), -1, at_start && from == 0});
  };
  std::vector<Seg> raw, segs;
  split(raw_trie, text, true, raw);
  for (Seg& r : raw) {
    if (r.added >= 0) {
      segs.push_back(std::move(r));
      continue;
    }
    if (normalizer) tok::normalize(*normalizer, r.text);
    split(normalized_trie, r.text, r.at_start, segs);
  }
  std::vector<int64_t> ids;
  for (Seg& s : segs) {
    if (s.added >= 0) {
      ids.push_back(s.added);
      continue;
    }
    std::vector<tok::Piece> pieces{{std::move(s.text), s.at_start}};
    if (pre) tok::pre_tokenize(*pre, pieces);
    for (const tok::Piece& p : pieces) bpe(p.text, ids);
  }
  return ids;
}

static const Tokenizer::Impl::Added* find_added(const Tokenizer::Impl& im, int64_t id) {
  auto a = im.added_by_id.find(id);
  return a == im.added_by_id.end() ? nullptr : &im.added[a->second];
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  EncodeOptions o;
  o.special = allow_special ? EncodeOptions::Special::all : EncodeOptions::Special::none;
  return encode(text, o);
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, const EncodeOptions& o) const {
  std::vector<int64_t> ids = impl_->encode_text(text, o);
  const tok::PostProcessor& pp = impl_->post;
  if (!o.add_special_tokens || !pp.has_template) return ids;
  std::vector<int64_t> out;
  for (const tok::TemplateItem& it : pp.single) {
    if (it.special) {
      const auto& s = pp.special_tokens.at(it.token);
      out.insert(out.end(), s.begin(), s.end());
    } else {
      out.insert(out.end(), ids.begin(), ids.end());
    }
  }
  return out;
}

std::vector<int64_t> Tokenizer::encode_pair(std::string_view a, std::string_view b, const EncodeOptions& o) const {
  const std::vector<int64_t> ia = impl_->encode_text(a, o), ib = impl_->encode_text(b, o);
  const tok::PostProcessor& pp = impl_->post;
  std::vector<int64_t> out;
  if (!o.add_special_tokens || !pp.has_template) {
    out = ia;
    out.insert(out.end(), ib.begin(), ib.end());
    return out;
  }
  for (const tok::TemplateItem& it : pp.pair) {
    const std::vector<int64_t>& s = it.special ? pp.special_tokens.at(it.token) : it.seq == 0 ? ia : ib;
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::string s(text);
  if (impl_->normalizer) tok::normalize(*impl_->normalizer, s);
  std::vector<tok::Piece> pieces;
  if (!s.empty()) pieces.push_back({std::move(s), true});
  if (impl_->pre) tok::pre_tokenize(*impl_->pre, pieces);
  std::vector<std::string> out;
  for (auto& p : pieces) out.push_back(std::move(p.text));
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    if (const auto* a = find_added(im, id)) {
      if (!(skip_special && a->special)) tokens.push_back(a->content);
      continue;
    }
    auto it = im.id_to_tok.find(id);
    TPU_CHECK(it != im.id_to_tok.end(), "Tokenizer::decode: id {} is not in the vocabulary of {} (size {})", id,
              im.source, vocab_size());
    tokens.push_back(it->second);
  }
  std::string out;
  if (im.decoder.kind == tok::Decoder::none) {  // the reference joins tokens with spaces
    for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
  } else {
    for (const std::string& t : tok::decode_chain(im.decoder, std::move(tokens))) out += t;
  }
  if (im.clean_up_spaces) {  // Transformers' clean_up_tokenization
    static const std::pair<const char*, const char*> kRules[] = {
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
        {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : kRules) {
      std::string r;
      const std::string f = from;
      size_t at = 0;
      for (size_t k; (k = out.find(f, at)) != std::string::npos; at = k + f.size()) r.append(out, at, k - at) += to;
      r.append(out, at);
      out.swap(r);
    }
  }
  return out;
}

int64_t Tokenizer::vocab_size() const { return impl_->max_id + 1; }

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto a = impl_->added_by_content.find(std::string(token)); a != impl_->added_by_content.end())
    return impl_->added[a->second].id;
  if (auto it = impl_->vocab.find(std::string(token)); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int64_t id) const {
  if (const auto* a = find_added(*impl_, id)) return a->content;
  auto it = impl_->id_to_tok.find(id);
  TPU_CHECK(it != impl_->id_to_tok.end(), "Tokenizer: id {} is not in the vocabulary of {}", id, impl_->source);
  return it->second;
}

bool Tokenizer::is_special(int64_t id) const {
  const auto* a = find_added(*impl_, id);
  return a != nullptr && a->special;
}

std::optional<std::string> Tokenizer::bos_token() const { return impl_->bos; }
std::optional<std::string> Tokenizer::eos_token() const { return impl_->eos; }
std::optional<std::string> Tokenizer::pad_token() const { return impl_->pad; }

}  // namespace tpu
