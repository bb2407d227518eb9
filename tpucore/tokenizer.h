/// @file
/// BPE tokenizers read from Hugging Face tokenizer.json files, with the tokenizers library's
/// semantics: byte-level BPE (GPT-2, Llama 3, Qwen 2/3, DeepSeek V3, gpt-oss) and
/// SentencePiece-style BPE (Llama 2, Mistral, Gemma: Metaspace or Replace normalizers,
/// byte_fallback).
///
/// The pipeline: added tokens are split out of the text (those marked `normalized: false`
/// first, on the raw text; the others after normalization), honouring their lstrip / rstrip /
/// single_word flags; the rest is normalized (NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend,
/// Replace, Sequence), cut by the pre-tokenizer (ByteLevel, Split with any regex or string and
/// any behavior, Metaspace, Sequence), and each piece is merged by rank (a priority queue over
/// pair ranks); the post_processor (TemplateProcessing, ByteLevel, Sequence) adds BOS / EOS.
/// decode() runs the decoder chain (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
/// Sequence). Every other component or option that changes results is a tpu::Error naming the
/// field at load. Byte-level decoding keeps the exact bytes (invalid UTF-8 included) where the
/// reference would write U+FFFD; otherwise results are the reference's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpu {

/// Options of Tokenizer::encode.
struct EncodeOptions {
  /// Add the special tokens the post_processor asks for (or tokenizer_config.json's
  /// add_bos_token / add_eos_token), as Hugging Face's `add_special_tokens`.
  bool add_special_tokens = true;
  /// Which added tokens marked special are matched in the text.
  enum class Special {
    all,     ///< every special token (the reference's default)
    none,    ///< none: their text is encoded as ordinary text (safe for user input)
    allowed  ///< only those listed in `allowed_special`
  };
  /// Matching of special tokens; added tokens not marked special are always matched.
  Special special = Special::all;
  /// The special tokens matched when `special` is Special::allowed (as tiktoken's allowed_special).
  std::vector<std::string> allowed_special;
};

/// A tokenizer read from a tokenizer.json file (and optionally its tokenizer_config.json).
class Tokenizer {
 public:
  /// Reads a tokenizer.json, and the tokenizer_config.json beside it when there is one; every
  /// malformed or unsupported part is a tpu::Error naming the file and the field.
  static Tokenizer from_file(const std::string& path);
  /// Reads a tokenizer.json and the given tokenizer_config.json (none when `config_path` is empty).
  static Tokenizer from_files(const std::string& path, const std::string& config_path);
  /// Reads tokenizer.json text (`source` names it in errors) and optional tokenizer_config.json text.
  static Tokenizer from_json(const std::string& text, const std::string& source = "tokenizer.json",
                             const std::string& config_text = "");

  /// Encodes text with the file's special tokens added; allow_special false encodes special
  /// tokens' text as ordinary text (Special::none).
  std::vector<int64_t> encode(std::string_view text, bool allow_special = true) const;
  /// Encodes text as the options say.
  std::vector<int64_t> encode(std::string_view text, const EncodeOptions& options) const;
  /// Encodes a pair of texts (the post_processor's pair template, or the two concatenated).
  std::vector<int64_t> encode_pair(std::string_view a, std::string_view b, const EncodeOptions& options = {}) const;
  /// Decodes ids; skip_special leaves out added tokens marked special. Applies
  /// clean_up_tokenization_spaces when tokenizer_config.json asks for it. Unknown ids are a
  /// tpu::Error.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;

  /// One past the largest id.
  int64_t vocab_size() const;
  /// The id of a vocabulary or added token.
  std::optional<int64_t> token_to_id(std::string_view token) const;
  /// A token as written in the file.
  std::string id_to_token(int64_t id) const;
  /// Whether the id is an added token marked special.
  bool is_special(int64_t id) const;
  /// The pieces the normalizer and pre-tokenizer cut text into, before any byte mapping
  /// (exposed for tests and tools).
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  /// tokenizer_config.json's bos_token, if any.
  std::optional<std::string> bos_token() const;
  /// tokenizer_config.json's eos_token, if any.
  std::optional<std::string> eos_token() const;
  /// tokenizer_config.json's pad_token, if any.
  std::optional<std::string> pad_token() const;

  /// The tokenizer's state (tpucore/io/tokenizer_impl.h).
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
  int64_t min_frequency = 2;                ///< pairs seen fewer times are not merged
};
/// Trains on `texts` (see BpeTrainOptions) and returns the tokenizer.json text.
std::string train_bpe_tokenizer(const std::vector<std::string>& texts, const BpeTrainOptions& options = {});

/// GPT-2's byte -> printable character table (as UTF-8); used by the tokenizer and by tools that
/// write byte-level vocabularies.
std::string byte_to_unicode(uint8_t b);

}  // namespace tpu
