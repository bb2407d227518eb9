// Byte-level BPE tokenizer on hand-made tokenizer.json files: encodings worked out by hand,
// pre-tokenizer splits of the GPT-2 / Llama 3 / Qwen2 patterns as the regexes define them,
// exact byte round trips (invalid UTF-8 too), added/special tokens, and malformed files.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "core/testing.h"
#include "tpucore/tokenizer.h"

using namespace tpu;
using tpu::testing::expect_error;
using json = nlohmann::json;

namespace {

// GPT-2's printable byte alphabet, written independently of the library: printable Latin-1
// bytes stand for themselves, the rest take U+0100.. in byte order.
std::string byte_char(int b) {
  static std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int extra = 0;
    for (int x = 0; x < 256; ++x) {
      const bool keep = (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff);
      const int cp = keep ? x : 0x100 + extra++;
      std::string s;
      if (cp < 0x80) s += static_cast<char>(cp);
      else {
        s += static_cast<char>(0xc0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3f));
      }
      t[x] = s;
    }
    return t;
  }();
  return table[static_cast<size_t>(b)];
}

// Vocabulary: byte b has id b; then the merges' results from 256 on.
json base_model(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json m = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    m.push_back(a + " " + b);
    vocab[a + b] = id++;
  }
  return json{{"type", "BPE"}, {"vocab", vocab}, {"merges", m}};
}

const std::string G = byte_char(' ');  // "Ġ"

json gpt2_file() {
  json j;
  j["model"] = base_model({{G, "t"}, {"h", "e"}, {G + "t", "he"}, {"l", "l"}});  // ids 256..259
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<|endoftext|>"}, {"special", true}},
                                   {{"id", 301}, {"content", "<|end|>"}, {"special", false}}});
  return j;
}

const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json split_file(const char* regex, bool ignore_merges) {
  json j = gpt2_file();
  j["model"]["ignore_merges"] = ignore_merges;
  j["model"]["vocab"]["hello"] = 400;  // reachable only through ignore_merges
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         json::array({{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}},
                                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  return j;
}

using V = std::vector<int64_t>;
using S = std::vector<std::string>;

}  // namespace

TEST_CASE("tokenizer: GPT-2 style encodings worked out by hand", "[tokenizer]") {
  Tokenizer t = Tokenizer::from_json(gpt2_file().dump());
  // "the": t h e -> (h,e) -> [t, he]; " cat": no merge applies to Ġ c a t.
  CHECK(t.encode("the cat") == V{'t', 257, ' ', 'c', 'a', 't'});
  // "hello": (h,e) rank 1 before (l,l) rank 3 -> [he, ll, o]; " the": Ġt, he, Ġthe.
  CHECK(t.encode("hello the world<|endoftext|>") ==
        V{257, 259, 'o', 258, ' ', 'w', 'o', 'r', 'l', 'd', 300});
  CHECK(t.encode("<|endoftext|>", false) == V{'<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>'});
  CHECK(t.encode("a<|end|>b<|endoftext|>") == V{'a', 301, 'b', 300});  // longest added token first
  CHECK(t.encode("") == V{});
  CHECK(t.decode({257, 259, 'o', 300}) == "hello<|endoftext|>");
  CHECK(t.decode({257, 300, 301}, true) == "he<|end|>");  // only special ones are skipped
  CHECK(t.vocab_size() == 302);
  CHECK(t.token_to_id(G + "the") == 258);
  CHECK(t.id_to_token(258) == G + "the");
  CHECK(t.is_special(300));
  CHECK_FALSE(t.is_special(301));
  // UTF-8: "é" is bytes c3 a9, each its own symbol.
  CHECK(t.encode("é") == V{0xc3, 0xa9});
}

TEST_CASE("tokenizer: pre-tokenizer splits follow each pattern", "[tokenizer]") {
  Tokenizer gpt2 = Tokenizer::from_json(gpt2_file().dump());
  Tokenizer llama3 = Tokenizer::from_json(split_file(kLlama3, false).dump());
  Tokenizer qwen2 = Tokenizer::from_json(split_file(kQwen2, false).dump());
  const std::string text = "I'm  fine\n\nok 12345 HE'S hi!!! ...";
  CHECK(gpt2.pre_tokenize(text) ==
        S{"I", "'m", " ", " fine", "\n", "\n", "ok", " 12345", " HE", "'", "S", " hi", "!!!", " ..."});
  CHECK(llama3.pre_tokenize(text) ==
        S{"I", "'m", " ", " fine", "\n\n", "ok", " ", "123", "45", " HE", "'S", " hi", "!!!", " ..."});
  CHECK(qwen2.pre_tokenize("x 2024") == S{"x", " ", "2", "0", "2", "4"});
  // Non-ASCII letters and numbers by Unicode class; tabs lead words in the Llama pattern.
  CHECK(gpt2.pre_tokenize("héllo wörld 日本語 ٣٤") == S{"héllo", " wörld", " 日本語", " ٣٤"});
  CHECK(llama3.pre_tokenize("a\tb;\n\nc   ") == S{"a", "\tb", ";\n\n", "c", "   "});
  CHECK(gpt2.pre_tokenize("a\tb;\n\nc   ") == S{"a", "\t", "b", ";", "\n", "\n", "c", "   "});
}

TEST_CASE("tokenizer: ignore_merges takes whole words from the vocabulary", "[tokenizer]") {
  CHECK(Tokenizer::from_json(split_file(kLlama3, true).dump()).encode("hello") == V{400});
  CHECK(Tokenizer::from_json(split_file(kLlama3, false).dump()).encode("hello") == V{257, 259, 'o'});
}

TEST_CASE("tokenizer: decode(encode(x)) gives back the exact bytes", "[tokenizer]") {
  Tokenizer t = Tokenizer::from_json(split_file(kLlama3, false).dump());
  const std::vector<std::string> texts{"Hello, world! The theme... 3.14159\r\n",
                                       "emoji \xF0\x9F\x98\x80 and ąčę, \xE6\x97\xA5\xE6\x9C\xAC",
                                       std::string("nul \0 byte", 10), "invalid \xff\xfe utf-8 \xC3", "<|endoftext|>x"};
  for (const auto& s : texts) {
    INFO(s);
    CHECK(t.decode(t.encode(s)) == s);
  }
  // Every byte value alone.
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, static_cast<char>(b));
    CHECK(t.encode(s) == V{b});
    CHECK(t.decode({b}) == s);
  }
}

TEST_CASE("tokenizer: malformed and unsupported files are named errors", "[tokenizer][errors]") {
  auto bad = [](const std::function<void(json&)>& edit, std::vector<std::string> parts) {
    json j = gpt2_file();
    edit(j);
    expect_error([&] { Tokenizer::from_json(j.dump(), "tok.json"); }, parts);
  };
  expect_error([] { Tokenizer::from_json("{\"model\": ", "tok.json"); }, {"tok.json", "invalid JSON"});
  bad([](json& j) { j.erase("model"); }, {"tok.json", "model"});
  bad([](json& j) { j["model"]["vocab"] = json::array(); }, {"model.vocab"});
  bad([](json& j) { j["model"]["vocab"]["x"] = -3; }, {"model.vocab['x']", "-3"});
  bad([](json& j) { j["model"]["vocab"]["dup"] = 5; }, {"id 5"});
  bad([](json& j) { j["model"]["merges"].push_back("q z zz"); }, {"model.merges[4]", "q z zz"});
  bad([](json& j) { j["model"]["merges"].push_back("q zzz"); }, {"zzz", "not in model.vocab"});
  bad([](json& j) { j["model"]["merges"].push_back(42); }, {"model.merges[4]"});
  bad([](json& j) { j["model"]["type"] = "Unigram"; }, {"Unigram"});
  bad([](json& j) { j["model"]["dropout"] = 0.1; }, {"model.dropout"});
  bad([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, {"continuing_subword_prefix"});
  bad([](json& j) { j["normalizer"] = {{"type", "BertNormalizer"}}; }, {"normalizer", "BertNormalizer"});
  bad([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, {"pre_tokenizer", "Whitespace"});
  bad([](json& j) { j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(\\w+"}}}, {"behavior", "Isolated"}}; },
      {"pre_tokenizer", "(\\w+", "does not compile"});
  bad([](json& j) { j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Sideways"}}; },
      {"behavior", "Sideways"});
  bad([](json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; }, {"post_processor", "RobertaProcessing"});
  bad([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, {"decoder", "WordPiece"});
  bad([](json& j) { j["truncation"] = {{"max_length", 8}}; }, {"truncation"});
  bad([](json& j) { j["added_tokens"][0]["lstrip"] = "yes"; }, {"lstrip"});
  bad([](json& j) { j["added_tokens"][0]["id"] = 65; }, {"<|endoftext|>", "id 65", "A"});
  bad([](json& j) { j["added_tokens"][1].erase("content"); }, {"added_tokens"});
  // Two added tokens with one id: decode could not tell them apart (a fuzzing finding).
  bad([](json& j) { j["added_tokens"][0]["id"] = 301; }, {"<|endoftext|>", "<|end|>", "both have id 301"});
  // A field of the wrong JSON type is a tpu::Error naming the file (a fuzzing finding).
  bad([](json& j) { j["pre_tokenizer"]["type"] = 130; }, {"tok.json", "pre_tokenizer", "type"});
  bad([](json& j) { j["model"]["type"] = json::array(); }, {"tok.json", "wrong type"});
  expect_error([] { Tokenizer::from_file("/nonexistent/tokenizer.json"); }, {"cannot open", "/nonexistent"});
  // A vocabulary without the symbol of byte 'z': encoding "z" names the byte; decoding an
  // unknown id names it.
  json j = gpt2_file();
  j["model"]["vocab"].erase("z");
  Tokenizer t = Tokenizer::from_json(j.dump(), "noz.json");
  expect_error([&] { t.encode("buzz"); }, {"noz.json", "0x7a"});
  expect_error([&] { t.decode({999}); }, {"id 999"});
  CHECK(t.encode("ab") == V{'a', 'b'});  // still usable
}
