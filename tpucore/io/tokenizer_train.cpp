// Byte-level BPE training (tpu::train_bpe_tokenizer): pair counts kept up to date per merge,
// touching only the pieces that hold the merged pair.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "tpucore/core/error.h"
#include "tpucore/io/tokenizer_internal.h"
#include "tpucore/tokenizer.h"

namespace tpu {

namespace {

using Key = uint64_t;  // (left id, right id)
Key key_of(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }
int32_t left_of(Key k) { return static_cast<int32_t>(k >> 32); }
int32_t right_of(Key k) { return static_cast<int32_t>(k & 0xffffffffu); }

struct Piece {
  std::vector<int32_t> sym;
  int64_t count;
};

}  // namespace

std::string train_bpe_tokenizer(const std::vector<std::string>& texts, const BpeTrainOptions& o) {
  tok::Pattern pattern = tok::Pattern::none;
  if (o.pattern == "gpt2") pattern = tok::Pattern::gpt2;
  else if (o.pattern == "llama3") pattern = tok::Pattern::llama3;
  else if (o.pattern == "qwen2") pattern = tok::Pattern::qwen2;
  else fail("train_bpe_tokenizer: unknown pre-tokenizer pattern '{}' (gpt2, llama3 or qwen2)", o.pattern);
  const int64_t base = 256 + static_cast<int64_t>(o.special_tokens.size());
  TPU_CHECK(o.vocab_size >= base && o.vocab_size <= (int64_t{1} << 30),
            "train_bpe_tokenizer: vocab_size {} must hold the 256 bytes and the {} special tokens ({} at least, 2^30 "
            "at most)",
            o.vocab_size, o.special_tokens.size(), base);
  TPU_CHECK(o.min_frequency >= 1, "train_bpe_tokenizer: min_frequency {} must be at least 1", o.min_frequency);
  std::unordered_set<std::string> seen_special;
  for (const std::string& s : o.special_tokens) {
    TPU_CHECK(!s.empty(), "train_bpe_tokenizer: a special token is empty");
    TPU_CHECK(seen_special.insert(s).second, "train_bpe_tokenizer: special token '{}' is given twice", s);
  }

  // Token strings in GPT-2's printable byte alphabet, by id.
  std::vector<std::string> str;
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) {
    str.push_back(byte_to_unicode(static_cast<uint8_t>(b)));
    id_of[str.back()] = b;
  }
  for (const std::string& s : o.special_tokens) str.push_back(s);  // not in id_of: never produced by a merge

  // The distinct pieces with their counts (sorted, so that training is deterministic).
  std::map<std::string_view, int64_t> counts;
  for (const std::string& t : texts)
    for (std::string_view p : tok::split_pieces(t, pattern)) ++counts[p];
  std::vector<Piece> pieces;
  pieces.reserve(counts.size());
  for (const auto& [p, n] : counts) {
    Piece w{{}, n};
    for (char ch : p) w.sym.push_back(static_cast<uint8_t>(ch));
    pieces.push_back(std::move(w));
  }

  std::unordered_map<Key, int64_t> pair_count;
  std::unordered_map<Key, std::vector<int32_t>> where;  // pieces that held the pair when it was added
  auto add_pairs = [&](int32_t w, int64_t sign, int32_t only_with) {
    const Piece& p = pieces[static_cast<size_t>(w)];
    for (size_t k = 0; k + 1 < p.sym.size(); ++k) {
      const Key key = key_of(p.sym[k], p.sym[k + 1]);
      auto it = pair_count.try_emplace(key, 0).first;
      it->second += sign * p.count;
      if (it->second == 0) pair_count.erase(it);
      if (sign > 0 && (only_with < 0 || p.sym[k] == only_with || p.sym[k + 1] == only_with)) where[key].push_back(w);
    }
  };
  for (size_t w = 0; w < pieces.size(); ++w) add_pairs(static_cast<int32_t>(w), +1, -1);

  nlohmann::json merges = nlohmann::json::array();
  std::unordered_set<Key> merged_pairs;  // a pair can form again when a merge reuses a token's string
  std::vector<int32_t> stamp(pieces.size(), -1);
  for (int32_t round = 0; static_cast<int64_t>(str.size()) < o.vocab_size; ++round) {
    Key best = 0;
    int64_t best_n = 0;
    for (const auto& [k, n] : pair_count)
      if (n > best_n || (n == best_n && k < best)) best = k, best_n = n;
    if (best_n < o.min_frequency) break;
    const int32_t a = left_of(best), b = right_of(best);
    const std::string merged = str[static_cast<size_t>(a)] + str[static_cast<size_t>(b)];
    int32_t id;
    if (auto it = id_of.find(merged); it != id_of.end()) {
      id = it->second;
    } else {
      id = static_cast<int32_t>(str.size());
      str.push_back(merged);
      id_of[merged] = id;
    }
    if (merged_pairs.insert(best).second) merges.push_back(str[static_cast<size_t>(a)] + " " + str[static_cast<size_t>(b)]);
    std::vector<int32_t> holders = std::move(where[best]);
    where.erase(best);
    for (int32_t w : holders) {
      if (stamp[static_cast<size_t>(w)] == round) continue;  // listed twice
      stamp[static_cast<size_t>(w)] = round;
      Piece& p = pieces[static_cast<size_t>(w)];
      bool holds = false;
      for (size_t k = 0; k + 1 < p.sym.size() && !holds; ++k) holds = p.sym[k] == a && p.sym[k + 1] == b;
      if (!holds) continue;  // an earlier merge took the pair out of this piece
      add_pairs(w, -1, -1);
      std::vector<int32_t> next;
      next.reserve(p.sym.size());
      for (size_t k = 0; k < p.sym.size(); ++k) {
        if (k + 1 < p.sym.size() && p.sym[k] == a && p.sym[k + 1] == b) {
          next.push_back(id);
          ++k;
        } else {
          next.push_back(p.sym[k]);
        }
      }
      p.sym = std::move(next);
      add_pairs(w, +1, id);
    }
  }

  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < str.size(); ++i)
    if (i < 256 || i >= static_cast<size_t>(base)) vocab[str[i]] = static_cast<int64_t>(i);
  nlohmann::json added = nlohmann::json::array();
  for (size_t i = 0; i < o.special_tokens.size(); ++i)
    added.push_back({{"id", 256 + static_cast<int64_t>(i)},
                     {"content", o.special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  nlohmann::json pre;
  if (pattern == tok::Pattern::gpt2) {
    pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  } else {
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", std::string(tok::pattern_regex(pattern))}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  }
  nlohmann::json j{{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", added},
                   {"normalizer", nullptr},
                   {"pre_tokenizer", pre},
                   {"post_processor", nullptr},
                   {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
                   {"model",
                    {{"type", "BPE"},
                     {"dropout", nullptr},
                     {"unk_token", nullptr},
                     {"continuing_subword_prefix", nullptr},
                     {"end_of_word_suffix", nullptr},
                     {"fuse_unk", false},
                     {"byte_fallback", false},
                     {"ignore_merges", false},
                     {"vocab", vocab},
                     {"merges", merges}}}};
  return j.dump();
}

}  // namespace tpu
