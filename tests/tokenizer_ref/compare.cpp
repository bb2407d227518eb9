// Compares tpu::Tokenizer with the reference's output (reference.mjs) on a corpus: ids with and
// without special tokens byte for byte, the decoding of the ids, and decode(encode(x)) == x
// wherever the reference's decoding gives the text back. Prints one line per difference and
// "N passed, N failed"; exits non-zero on any difference. When a tokenizer_config.json lies beside
// the file, the tokenizer read with it must name existing bos / eos tokens and add them as the
// config's add_bos_token / add_eos_token say (Transformers' rule), else as the file's template.
//   tokenizer_compare tokenizer.json corpus.json reference.json
#include <fmt/core.h>

#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tpucore/core/error.h"
#include "tpucore/tokenizer.h"

namespace {

nlohmann::json load(const char* path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::string ids_str(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t k = 0; k < v.size() && k < 40; ++k) {
    if (k) s += ',';
    s += std::to_string(v[k]);
  }
  return s + (v.size() > 40 ? ",..." : "");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    fmt::print(stderr, "usage: {} tokenizer.json corpus.json reference.json\n", argv[0]);
    return 2;
  }
  int passed = 0, failed = 0;
  try {
    const tpu::Tokenizer tok = tpu::Tokenizer::from_files(argv[1], "");
    const auto corpus = load(argv[2]), ref = load(argv[3]);
    if (!corpus.is_array() || !ref.is_array() || corpus.size() != ref.size()) {
      fmt::print("corpus and reference differ in length\n");
      return 1;
    }
    for (size_t i = 0; i < corpus.size(); ++i) {
      const std::string text = corpus[i].get<std::string>();
      const auto want_sp = ref[i]["with_special"].get<std::vector<int64_t>>();
      const auto want = ref[i]["without_special"].get<std::vector<int64_t>>();
      const std::string want_text = ref[i]["decoded"].get<std::string>();
      tpu::EncodeOptions plain;
      plain.add_special_tokens = false;
      const auto got_sp = tok.encode(text), got = tok.encode(text, plain);
      const std::string got_text = tok.decode(got);
      auto check = [&](bool ok, const char* what, const std::string& detail) {
        ok ? ++passed : ++failed;
        if (!ok) fmt::print("text {} {}: {}\n", i, what, detail);
      };
      check(got_sp == want_sp, "ids with special tokens", "got " + ids_str(got_sp) + " want " + ids_str(want_sp));
      check(got == want, "ids without special tokens", "got " + ids_str(got) + " want " + ids_str(want));
      check(got_text == want_text, "decode", "got '" + got_text + "' want '" + want_text + "'");
      if (want_text == text) check(got_text == text, "decode(encode(x)) == x", got_text);
    }
    const std::string dir = std::string(argv[1]).substr(0, std::string(argv[1]).rfind('/') + 1);
    if (std::ifstream(dir + "tokenizer_config.json").good()) {
      const auto cfg = load((dir + "tokenizer_config.json").c_str());
      const tpu::Tokenizer with_cfg = tpu::Tokenizer::from_file(argv[1]);
      auto name = [&](const char* k) -> std::optional<std::string> {
        if (!cfg.contains(k) || cfg[k].is_null()) return std::nullopt;
        return cfg[k].is_string() ? cfg[k].get<std::string>() : cfg[k]["content"].get<std::string>();
      };
      auto check = [&](bool ok, const std::string& what) {
        ok ? ++passed : ++failed;
        if (!ok) fmt::print("tokenizer_config.json: {}\n", what);
      };
      check(with_cfg.bos_token() == name("bos_token") && with_cfg.eos_token() == name("eos_token"), "bos / eos tokens");
      for (const char* k : {"bos_token", "eos_token", "pad_token"})
        if (name(k)) check(with_cfg.token_to_id(*name(k)).has_value(), std::string(k) + " is not a token");
      const bool keys = cfg.contains("add_bos_token") || cfg.contains("add_eos_token");
      for (size_t i = 0; i < corpus.size(); ++i) {
        const std::string text = corpus[i].get<std::string>();
        std::vector<int64_t> want;
        if (!keys) {
          want = ref[i]["with_special"].get<std::vector<int64_t>>();
        } else {
          if (cfg.value("add_bos_token", false)) want.push_back(*with_cfg.token_to_id(*name("bos_token")));
          for (int64_t id : ref[i]["without_special"]) want.push_back(id);
          if (cfg.value("add_eos_token", false)) want.push_back(*with_cfg.token_to_id(*name("eos_token")));
        }
        check(with_cfg.encode(text) == want, "text " + std::to_string(i) + " ids with the config's special tokens");
      }
    }
  } catch (const std::exception& e) {
    fmt::print("error: {}\n", e.what());
    ++failed;
  }
  fmt::print("{} passed, {} failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
