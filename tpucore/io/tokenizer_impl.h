// The state of a tpu::Tokenizer, shared by its source files (tokenizer.cpp encodes and decodes,
// tokenizer_load.cpp reads tokenizer.json and tokenizer_config.json into it).
#pragma once

#include <optional>

#include "tpucore/io/tokenizer_internal.h"
#include "tpucore/tokenizer.h"

namespace tpu {

struct Tokenizer::Impl {
  struct PairHash {
    size_t operator()(const std::pair<int64_t, int64_t>& p) const {
      // Unsigned: a file may give ids near the int64 range.
      return std::hash<uint64_t>()(static_cast<uint64_t>(p.first) * 1000003u + static_cast<uint64_t>(p.second));
    }
  };
  struct Added {
    std::string content;
    int64_t id;
    bool special, lstrip, rstrip, single_word, normalized;
  };

  std::string source;
  std::unordered_map<std::string, int64_t> vocab;
  std::unordered_map<int64_t, std::string> id_to_tok;
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>, PairHash> merges;
  std::vector<Added> added;  // in file order, one per id
  std::unordered_map<int64_t, size_t> added_by_id;
  std::unordered_map<std::string, size_t> added_by_content;
  tok::Trie raw_trie, normalized_trie;  // added tokens matched before / after normalization
  std::optional<tok::Normalizer> normalizer;
  std::optional<tok::PreTokenizer> pre;
  bool byte_level = false;  // the pre-tokenizer maps bytes to GPT-2's alphabet
  tok::Decoder decoder;
  tok::PostProcessor post;
  bool ignore_merges = false, byte_fallback = false, fuse_unk = false;
  std::optional<int64_t> unk_id;
  int64_t max_id = -1;
  std::optional<std::string> bos, eos, pad;
  bool clean_up_spaces = false;

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache;

  // The BPE model on one pre-tokenized piece.
  void bpe(const std::string& piece, std::vector<int64_t>& out) const;
  // Added-token split, normalization, pre-tokenization and BPE (no post-processing).
  std::vector<int64_t> encode_text(std::string_view text, const EncodeOptions& o) const;
};

}  // namespace tpu
