// Fuzzes the tokenizer.json reader and the encoder (tpu::Tokenizer). An input is a tokenizer.json
// text, then a NUL byte, then a text to encode (no NUL: the whole input is the file and the text
// is a fixed sample). A file the reader accepts must encode the text (with and without special
// tokens, with special tokens matched or taken as text, alone and as a pair) to ids of its
// vocabulary that decode without error; for a lossless file (byte-level pre-tokenizer and
// decoder, no normalizer, add_prefix_space false on every ByteLevel step) the ids without
// special tokens decode back to the exact bytes of the text (invalid UTF-8 included); decoding
// must reject an id past the vocabulary with a tpu::Error.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "tpucore/core/error.h"
#include "tpucore/tokenizer.h"
#include "fuzz_common.h"

// Added tokens that decode to their own text: ASCII contents (a byte-level decoder maps other
// characters to bytes) that take no white space around them (lstrip / rstrip).
static bool plain_added(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("added_tokens") || !j["added_tokens"].is_array()) return true;
  for (const auto& a : j["added_tokens"]) {
    if (!a.is_object()) continue;
    if (a.value("lstrip", false) == true || a.value("rstrip", false) == true) return false;
    if (a.contains("content") && a["content"].is_string())
      for (char c : a["content"].get<std::string>())
        if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// True when no ByteLevel pre-tokenizer (at any depth of a Sequence) adds a prefix space. The
// option defaults to true when the key is absent, as in Hugging Face tokenizers, and then every
// piece of the previous step gains a leading space, which decoding keeps.
static bool no_prefix_space(const nlohmann::json& p) {
  if (p.is_array()) return std::all_of(p.begin(), p.end(), [](const nlohmann::json& e) { return no_prefix_space(e); });
  if (!p.is_object()) return true;
  if (p.contains("type") && p["type"] == "ByteLevel") {
    const auto it = p.find("add_prefix_space");
    if (it == p.end() || *it != false) return false;
  }
  for (const auto& [k, v] : p.items())
    if ((v.is_array() || v.is_object()) && !no_prefix_space(v)) return false;
  return true;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in = tpu_fuzz::text_of(data, size);
  const size_t nul = in.find('\0');
  const std::string file = in.substr(0, nul);
  const std::string text = nul == std::string::npos ? std::string("Hello, world! 123 \xc3\xa9\xff") : in.substr(nul + 1);
  std::optional<tpu::Tokenizer> tok;
  try {
    tok.emplace(tpu::Tokenizer::from_json(file, "fuzz.json"));
  } catch (const tpu::Error&) {
    return 0;
  }
  std::vector<int64_t> ids;
  tpu::EncodeOptions plain;
  plain.add_special_tokens = false;
  tpu::EncodeOptions as_text;
  as_text.special = tpu::EncodeOptions::Special::none;
  tpu::EncodeOptions some;
  some.special = tpu::EncodeOptions::Special::allowed;
  some.allowed_special = {"<s>", "<|endoftext|>"};
  const int64_t n = tok->vocab_size();
  std::vector<std::vector<int64_t>> all;
  try {
    ids = tok->encode(text, plain);
    all = {ids, tok->encode(text), tok->encode(text, as_text), tok->encode(text, some),
           tok->encode_pair(text, text.substr(0, text.size() / 2))};
  } catch (const tpu::Error&) {
    return 0;  // e.g. a vocabulary without some byte's token: reported, not a crash
  }
  for (const auto& v : all) {
    for (int64_t id : v)
      if (id < 0 || id >= n) tpu_fuzz::finding("encode gave an id outside the vocabulary", std::to_string(id));
    try {
      (void)tok->decode(v, true);
    } catch (const tpu::Error& e) {
      tpu_fuzz::finding("decode rejected the ids encode gave", e.what());
    }
  }
  std::string back;
  try {
    back = tok->decode(ids);
  } catch (const tpu::Error& e) {
    tpu_fuzz::finding("decode rejected the ids encode gave", e.what());
  }
  // Lossless files: byte-level pieces and decoder, nothing added to or changed in the text.
  const auto j = nlohmann::json::parse(file, nullptr, false);
  auto type_of = [&](const char* k) {
    return j.is_object() && j.contains(k) && j[k].is_object() && j[k].contains("type") && j[k]["type"].is_string()
               ? j[k]["type"].get<std::string>()
               : std::string();
  };
  const std::string pre = j.is_object() && j.contains("pre_tokenizer") ? j["pre_tokenizer"].dump() : std::string();
  const bool lossless = type_of("decoder") == "ByteLevel" && (!j.contains("normalizer") || j["normalizer"].is_null()) &&
                        pre.find("ByteLevel") != std::string::npos && pre.find("Metaspace") == std::string::npos &&
                        j.contains("pre_tokenizer") && no_prefix_space(j["pre_tokenizer"]) &&
                        pre.find("Removed") == std::string::npos && plain_added(j);
  if (lossless && back != text) tpu_fuzz::finding("decode(encode(text)) is not the text", back);
  try {
    (void)tok->decode({n});
    tpu_fuzz::finding("decode accepted an id past the vocabulary");
  } catch (const tpu::Error&) {
  }
  return 0;
}
