// The tokenizer's Hugging Face pipeline pieces on hand-made files: normalizers (expected forms
// from the Unicode tables), SentencePiece-style BPE with byte_fallback and its decoders, Split
// behaviors (the reference library's documented example), Metaspace, added-token flags and the
// special-token allow-list, templates and tokenizer_config.json, all worked out by hand; the
// priority-queue BPE against a naive merge loop on random vocabularies.
#include <catch2/catch.hpp>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/testing.h"
#include "tpucore/tokenizer.h"

using namespace tpu;
using tpu::testing::expect_error;
using json = nlohmann::json;

namespace {

using V = std::vector<int64_t>;
using S = std::vector<std::string>;
const std::string kMeta = "\u2581";

// A SentencePiece-style file: <unk> <s> </s>, the 256 <0xXX> byte tokens (ids 3..258), then a
// few pieces; Llama 2's normalizer, template and decoder.
json sp_file() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int id = 259;
  for (const std::string& t : {kMeta, std::string("h"), std::string("i"), kMeta + "h", kMeta + "hi", std::string("e"),
                              std::string("l"), std::string("o"), std::string("ll"), std::string("x"), kMeta + "x"})
    vocab[t] = id++;  // ▁ 259, h 260, i 261, ▁h 262, ▁hi 263, e 264, l 265, o 266, ll 267, x 268, ▁x 269
  json j;
  j["model"] = {{"type", "BPE"},          {"vocab", vocab},       {"unk_token", "<unk>"},
                {"byte_fallback", true},  {"fuse_unk", true},     {"merges", {kMeta + " h", kMeta + "h i", "l l", kMeta + " x"}}};
  j["added_tokens"] = json::array();
  for (int k = 0; k < 3; ++k)
    j["added_tokens"].push_back({{"id", k}, {"content", k == 0 ? "<unk>" : k == 1 ? "<s>" : "</s>"}, {"special", true},
                                 {"normalized", false}});
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "Prepend"}, {"prepend", kMeta}},
                                      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}}}};
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "<s>"}, {"type_id", 1}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  return j;
}

// The same vocabulary cut by a Metaspace pre-tokenizer instead of the normalizer.
json metaspace_file(const std::string& scheme) {
  json j = sp_file();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", scheme}, {"split", true}};
  return j;
}

// Bytes are ids 0..255 in GPT-2's alphabet (written out here independently of the library).
std::string gpt2_char(int b) {
  const bool keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  int extra = 0;
  for (int x = 0; x < b; ++x) extra += !((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff));
  const int cp = keep ? b : 0x100 + extra;
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else s += static_cast<char>(0xc0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3f));
  return s;
}

json byte_file(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[gpt2_char(b)] = b;
  json m = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    m.push_back(json::array({a, b}));
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
  }
  json j;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}};
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  return j;
}

// Only a normalizer: pre_tokenize() gives the normalized text.
std::string normalized(const json& normalizer, const std::string& text) {
  json j = byte_file({});
  j["normalizer"] = normalizer;
  j["pre_tokenizer"] = nullptr;
  const auto p = Tokenizer::from_json(j.dump()).pre_tokenize(text);
  return p.empty() ? std::string() : p[0];
}

}  // namespace

TEST_CASE("tokenizer: normalizers", "[tokenizer]") {
  CHECK(normalized({{"type", "NFC"}}, "e\u0301 A\u030a") == "\u00e9 \u00c5");
  CHECK(normalized({{"type", "NFD"}}, "\u00e9") == "e\u0301");
  CHECK(normalized({{"type", "NFKC"}}, "\ufb01 \u2460 \uff21") == "fi 1 A");
  CHECK(normalized({{"type", "NFKD"}}, "\u00bd") == "1\u20442");
  // Each character's own lowercase mapping: no final-sigma rule, İ -> i + combining dot.
  CHECK(normalized({{"type", "Lowercase"}}, "\u00c0B \u0130 \u039f\u03a3") == "\u00e0b i\u0307 \u03bf\u03c3");
  CHECK(normalized({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, " \t a b \u3000") == "a b");
  CHECK(normalized({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}}, " a ") == " a");
  CHECK(normalized({{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}}, "a   b  c d") == "a b c d");
  CHECK(normalized({{"type", "Sequence"},
                    {"normalizers", {{{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}},
                                     {{"type", "Prepend"}, {"prepend", kMeta}}}}},
                   "x  ") == kMeta + "x");
  CHECK(normalized({{"type", "Prepend"}, {"prepend", kMeta}}, "").empty());  // nothing to prepend to
}

TEST_CASE("tokenizer: SentencePiece-style BPE with byte_fallback", "[tokenizer]") {
  const Tokenizer t = Tokenizer::from_json(sp_file().dump());
  EncodeOptions plain;
  plain.add_special_tokens = false;
  CHECK(t.encode("hi") == V{1, 263});
  CHECK(t.encode("hi", plain) == V{263});
  // ▁ h i ▁ h e l l o: (▁,h) at 0 and 3, (▁h,i) at 0, (l,l).
  CHECK(t.encode("hi hello", plain) == V{263, 262, 264, 267, 266});
  // ü is not a piece: its UTF-8 bytes c3 bc.
  CHECK(t.encode("h\u00fc", plain) == V{262, 3 + 0xc3, 3 + 0xbc});
  CHECK(t.decode({1, 263, 262, 3 + 0xc3, 3 + 0xbc}) == "<s> hi h\u00fc");
  CHECK(t.decode({1, 263, 262, 3 + 0xc3, 3 + 0xbc}, true) == "hi h\u00fc");
  CHECK(t.decode({263, 3 + 0xc3}) == "hi\ufffd");  // a lone byte of a longer character
  // Special tokens are split out before the normalizer; the text after one gets its own ▁.
  CHECK(t.encode("<s>hi", plain) == V{1, 263});
  CHECK(t.encode_pair("hi", "x") == V{1, 263, 1, 269});
  // Without byte_fallback an unknown character is <unk>, consecutive ones fused.
  json j = sp_file();
  j["model"]["byte_fallback"] = false;
  CHECK(Tokenizer::from_json(j.dump()).encode("h\u00fc\u00fc", plain) == V{262, 0});
  j["model"]["fuse_unk"] = false;
  CHECK(Tokenizer::from_json(j.dump()).encode("h\u00fc\u00fc", plain) == V{262, 0, 0});
}

TEST_CASE("tokenizer: special tokens by allow-list", "[tokenizer]") {
  const Tokenizer t = Tokenizer::from_json(sp_file().dump());
  EncodeOptions o;
  o.add_special_tokens = false;
  o.special = EncodeOptions::Special::none;
  // "▁</s>hi" as text: < / s > by bytes (s has no piece of its own here).
  const V as_text{259, 3 + '<', 3 + '/', 3 + 's', 3 + '>', 260, 261};
  CHECK(t.encode("</s>hi", o) == as_text);
  o.special = EncodeOptions::Special::allowed;
  o.allowed_special = {"<s>"};
  CHECK(t.encode("</s>hi", o) == as_text);
  o.allowed_special = {"</s>"};
  CHECK(t.encode("</s>hi", o) == V{2, 263});
  CHECK(t.encode("</s>hi", false) == V{1, 259, 3 + '<', 3 + '/', 3 + 's', 3 + '>', 260, 261});
}

TEST_CASE("tokenizer: Metaspace pre-tokenizer and Split behaviors", "[tokenizer]") {
  const Tokenizer first = Tokenizer::from_json(metaspace_file("first").dump());
  CHECK(first.pre_tokenize("hi  x") == S{kMeta + "hi", kMeta, kMeta + "x"});
  EncodeOptions plain;
  plain.add_special_tokens = false;
  CHECK(first.encode("x", plain) == V{269});
  CHECK(first.encode("<s>x", plain) == V{1, 268});  // "first": only at the start of the input
  CHECK(Tokenizer::from_json(metaspace_file("always").dump()).encode("<s>x", plain) == V{1, 269});
  CHECK(Tokenizer::from_json(metaspace_file("never").dump()).encode("x", plain) == V{268});
  // The reference library's documented example of each behavior.
  auto split = [](const char* behavior) {
    json j = byte_file({});
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}};
    return Tokenizer::from_json(j.dump()).pre_tokenize("the-final--countdown");
  };
  CHECK(split("Removed") == S{"the", "final", "countdown"});
  CHECK(split("Isolated") == S{"the", "-", "final", "-", "-", "countdown"});
  CHECK(split("MergedWithPrevious") == S{"the-", "final-", "-", "countdown"});
  CHECK(split("MergedWithNext") == S{"the", "-final", "-", "-countdown"});
  CHECK(split("Contiguous") == S{"the", "-", "final", "--", "countdown"});
  // A regex the hand-written patterns do not cover runs on the regex engine.
  json j = byte_file({});
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}};
  CHECK(Tokenizer::from_json(j.dump()).pre_tokenize("ab12345c") == S{"ab", "123", "45", "c"});
}

TEST_CASE("tokenizer: added-token flags", "[tokenizer]") {
  json j = byte_file({});
  j["added_tokens"] = {{{"id", 300}, {"content", "<m>"}, {"lstrip", true}, {"rstrip", true}},
                       {{"id", 301}, {"content", "ab"}, {"single_word", true}},
                       {{"id", 302}, {"content", "<n>"}},
                       {{"id", 303}, {"content", "XY"}, {"normalized", true}}};
  const Tokenizer t = Tokenizer::from_json(j.dump());
  CHECK(t.encode("a <m> b") == V{'a', 300, 'b'});            // the spaces around go with the token
  CHECK(t.encode("a <n> b") == V{'a', ' ', 302, ' ', 'b'});  // no flags: they stay text
  CHECK(t.encode("ab cab ab") == V{301, ' ', 'c', 'a', 'b', ' ', 301});  // not inside a word
  // A normalized added token is matched after normalization, and normalized itself.
  j["normalizer"] = {{"type", "Lowercase"}};
  const Tokenizer lower = Tokenizer::from_json(j.dump());
  CHECK(lower.encode("aXYb") == V{'a', 303, 'b'});
  CHECK(lower.encode("axyb") == V{'a', 303, 'b'});
}

TEST_CASE("tokenizer: tokenizer_config.json", "[tokenizer]") {
  const std::string cfg = R"({"add_bos_token": false, "add_eos_token": true, "bos_token": {"content": "<s>"},
                              "eos_token": "</s>", "pad_token": null})";
  const Tokenizer t = Tokenizer::from_json(sp_file().dump(), "tok.json", cfg);
  CHECK(t.encode("hi") == V{263, 2});
  CHECK(t.encode_pair("hi", "x") == V{263, 2, 269, 2});
  CHECK(t.bos_token() == std::optional<std::string>("<s>"));
  CHECK(t.eos_token() == std::optional<std::string>("</s>"));
  CHECK_FALSE(t.pad_token().has_value());
  json g = byte_file({});
  const Tokenizer clean = Tokenizer::from_json(g.dump(), "g.json", R"({"clean_up_tokenization_spaces": true})");
  const V ids = clean.encode("a , b .");
  CHECK(ids == V{'a', ' ', ',', ' ', 'b', ' ', '.'});
  CHECK(clean.decode(ids) == "a, b.");
  CHECK(Tokenizer::from_json(g.dump()).decode(ids) == "a , b .");
  expect_error([&] { Tokenizer::from_json(sp_file().dump(), "tok.json", R"({"add_bos_token": true, "bos_token": "<q>"})"); },
               {"tokenizer_config.json", "bos_token", "<q>"});
  expect_error([&] { Tokenizer::from_json(sp_file().dump(), "tok.json", R"({"split_special_tokens": true})"); },
               {"tokenizer_config.json", "split_special_tokens"});
}

TEST_CASE("tokenizer: BPE merges equal a naive lowest-rank-first loop", "[tokenizer]") {
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    // Random merges over the letters a, b, c (each result a new or existing string).
    std::vector<std::string> toks{"a", "b", "c"};
    std::vector<std::pair<std::string, std::string>> merges;
    std::map<std::pair<std::string, std::string>, size_t> rank;
    for (int k = 0; k < 30; ++k) {
      const std::string x = toks[rng() % toks.size()], y = toks[rng() % toks.size()];
      if (rank.count({x, y}) || x.size() + y.size() > 6) continue;
      rank[{x, y}] = merges.size();
      merges.emplace_back(x, y);
      if (std::find(toks.begin(), toks.end(), x + y) == toks.end()) toks.push_back(x + y);
    }
    const json j = byte_file(merges);
    const Tokenizer t = Tokenizer::from_json(j.dump());
    for (int s = 0; s < 20; ++s) {
      std::string text;
      for (size_t n = 1 + rng() % 40; n > 0; --n) text += static_cast<char>('a' + rng() % 3);
      std::vector<std::string> sym;
      for (char c : text) sym.emplace_back(1, c);
      for (;;) {  // merge the leftmost pair of lowest rank, one at a time
        size_t best = SIZE_MAX, at = 0;
        for (size_t k = 0; k + 1 < sym.size(); ++k)
          if (auto r = rank.find({sym[k], sym[k + 1]}); r != rank.end() && r->second < best) best = r->second, at = k;
        if (best == SIZE_MAX) break;
        sym[at] += sym[at + 1];
        sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
      }
      V want;
      for (const auto& x : sym) want.push_back(j["model"]["vocab"][x].get<int64_t>());
      INFO(text);
      CHECK(t.encode(text) == want);
    }
  }
}
