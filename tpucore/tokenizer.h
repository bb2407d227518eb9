/// @file
/// Byte-level BPE tokenizers read from Hugging Face tokenizer.json files (GPT-2, Llama 3, Qwen2
/// style): added / special tokens are split out first, the rest is cut by the pre-tokenizer's
/// pattern (GPT-2's, Llama 3's or Qwen2's, recognised by their regex text and matched by hand
/// with Unicode letter / number / white-space classes), each piece's UTF-8 bytes are mapped to
/// GPT-2's printable byte alphabet and merged by rank. decode() maps back to the exact bytes.
///
/// Supported: model.type "BPE" with vocab and merges (as "a b" strings or [a, b] pairs),
/// ignore_merges, pre_tokenizer ByteLevel (add_prefix_space, use_regex) or a Sequence of Split
/// (one of the three patterns, behavior Isolated) and ByteLevel, decoder ByteLevel, added_tokens.
/// Not supported (a tpu::Error at load): sentencepiece-style files (Metaspace, byte_fallback),
/// normalizers, other patterns. Invalid UTF-8 in the input is kept byte for byte.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpu {

/// A byte-level BPE tokenizer (see the file's description). Cheap to copy (shares the tables).
class Tokenizer {
 public:
  /// Reads a tokenizer.json; every malformed or unsupported part is a tpu::Error naming the file
  /// and the field.
  static Tokenizer from_file(const std::string& path);
  /// Reads tokenizer.json text; `source` names it in error messages.
  static Tokenizer from_json(const std::string& text, const std::string& source = "tokenizer.json");

  /// allow_special: match added tokens in the text (as Hugging Face does by default).
  std::vector<int64_t> encode(std::string_view text, bool allow_special = true) const;
  /// skip_special: leave out added tokens marked special. Unknown ids are a tpu::Error.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;

  int64_t vocab_size() const;  ///< one past the largest id
  std::optional<int64_t> token_to_id(std::string_view token) const;  ///< vocabulary or added token
  std::string id_to_token(int64_t id) const;                         ///< as written in the file
  /// True for an added token marked special.
  bool is_special(int64_t id) const;
  /// The pieces the pre-tokenizer cuts text into (exposed for tests and tools).
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  struct Impl;

 private:
  Tokenizer() = default;
  std::shared_ptr<const Impl> impl_;
};

/// Learns a byte-level BPE vocabulary from text, as Hugging Face's BpeTrainer does for GPT-2
/// style tokenizers, and returns it as tokenizer.json text (Tokenizer::from_json reads it; write
/// it next to a checkpoint). Ids: the 256 bytes first (in byte order), then the special tokens
/// (in the order given, added tokens marked special, never merged or matched inside the training
/// text), then one token per merge. Each text is cut by the pre-tokenizer pattern, equal pieces
/// are counted once with their frequency, and merges never cross a piece. Every round merges the
/// adjacent pair seen most often over all piece occurrences (overlapping positions counted, as
/// "aaa" holds "aa" twice); ties go to the pair of smaller (left id, right id). A merge whose
/// string already exists (reached through another split) reuses that token. Training stops at
/// `vocab_size` tokens, or when no pair is seen `min_frequency` times.
struct BpeTrainOptions {
  int64_t vocab_size = 1024;                ///< bytes + special tokens + merged tokens
  std::vector<std::string> special_tokens;  ///< e.g. {"<|endoftext|>"}: ids 256, 257, ...
  std::string pattern = "gpt2";             ///< pre-tokenizer split: "gpt2", "llama3" or "qwen2"
  /// A pair seen fewer times is never merged (at least 1).
  int64_t min_frequency = 2;
};
/// Trains on `texts`; a bad pattern name, a vocab_size below 256 + the special tokens, an empty
/// or repeated special token, or min_frequency < 1 is a tpu::Error.
std::string train_bpe_tokenizer(const std::vector<std::string>& texts, const BpeTrainOptions& options = {});

/// GPT-2's byte -> printable character table (as UTF-8) and its inverse; used by the tokenizer
/// and by tools that write byte-level vocabularies.
std::string byte_to_unicode(uint8_t b);

}  // namespace tpu
