// Constrained decoding for structured output: a JSON automaton over the vocabulary's token bytes.
//
// A JsonConstraint is compiled once per request from a JSON schema (or "any JSON object", the
// OpenAI json_object mode), optionally between two literal texts (a tool call's
// `<tool_call>` ... `</tool_call>`). It is a pushdown automaton over bytes; a state is the set of
// its live stacks (anyOf, enums and object keys branch). At each step the engine asks which tokens
// keep the output a prefix of a valid document (allowed()): the vocabulary's token bytes are kept
// sorted once per tokenizer (TokenBytes), so one walk shares the automaton's work across tokens
// with a common prefix and skips every token below a rejected prefix; masks are cached per state.
// Stop tokens (the request's end-of-sequence ids) are allowed exactly when the value is complete,
// and a state from which no byte may follow ends the request.
//
// Schema subset: type (object, array, string, number, integer, boolean, null, or a list of them),
// properties, required, additionalProperties (false; true or a schema only for an object without
// properties), items, enum, const, anyOf, and annotations (title, description, default, examples,
// $schema, strict). Any other keyword that changes what is valid (pattern, minLength, format,
// $ref, ...) is an UnsupportedSchema naming it. Object properties may come in any order, each at
// most once; properties outside `required` may be left out. Whitespace between tokens is at most
// kMaxWhitespace bytes per gap, digit runs of numbers at most kMaxDigits, so output cannot loop
// on them forever.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "tpucore/core/error.h"

namespace tpu::serve {

// A schema keyword or value the automaton does not implement; keyword() names it.
class UnsupportedSchema : public Error {
 public:
  UnsupportedSchema(const std::string& keyword, const std::string& what) : Error(what), keyword_(keyword) {}
  const std::string& keyword() const { return keyword_; }

 private:
  std::string keyword_;
};

// Every token's bytes (nullopt: a token without text, e.g. a special token), sorted for the walk.
class TokenBytes {
 public:
  explicit TokenBytes(std::vector<std::optional<std::string>> bytes);
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::optional<std::string>& bytes(int64_t id) const { return bytes_[static_cast<size_t>(id)]; }
  // Ids with text in byte order, and each one's common prefix length with the one before.
  const std::vector<int64_t>& order() const { return order_; }
  const std::vector<uint32_t>& common() const { return common_; }

 private:
  std::vector<std::optional<std::string>> bytes_;
  std::vector<int64_t> order_;
  std::vector<uint32_t> common_;
};

class JsonConstraint {
 public:
  static constexpr int kMaxWhitespace = 16;
  static constexpr int kMaxDigits = 18;

  // One frame of a stack (internal; compared and hashed as plain data).
  struct Frame {
    int32_t node = 0;
    uint8_t kind = 0, phase = 0;
    uint16_t ws = 0;
    int32_t a = 0, b = 0;
    uint64_t used = 0;
    auto key() const { return std::tie(node, kind, phase, ws, a, b, used); }
    bool operator<(const Frame& o) const { return key() < o.key(); }
    bool operator==(const Frame& o) const { return key() == o.key(); }
  };
  using Stack = std::vector<Frame>;
  // The automaton's state: its live stacks (empty: the output can no longer be valid).
  struct State {
    std::vector<Stack> stacks;
  };

  // schema null: any JSON object (json_object). prefix / suffix: literal text around the value.
  static std::shared_ptr<const JsonConstraint> compile(const nlohmann::json& schema,
                                                       std::shared_ptr<const TokenBytes> vocab,
                                                       const std::string& prefix = "", const std::string& suffix = "");

  State start() const;
  // Feeds bytes; false (and the state left dead) when they cannot continue a valid document.
  bool feed(State& s, const std::string& bytes) const;
  // The value (and suffix) is complete: the output may end here.
  bool complete(const State& s) const;
  // Complete and no further byte can follow.
  bool finished(const State& s) const;
  // Per token id: 1 when its bytes keep the state alive (tokens without text: 0).
  std::shared_ptr<const std::vector<uint8_t>> allowed(const State& s) const;
  // Advances by a token's bytes; false when the token is not allowed.
  bool advance(State& s, int64_t token) const;
  const TokenBytes& vocab() const { return *vocab_; }

  // Compiled schema nodes (internal).
  struct Node {
    int kind = 0;
    std::vector<std::pair<std::string, int32_t>> props;  // escaped name, node
    uint64_t required = 0;
    int32_t additional = -1;  // node of extra keys' values (objects without properties), -1: none
    int32_t items = -1;
    std::vector<int32_t> alts;      // anyOf alternatives, or literal ids
  };

 private:
  JsonConstraint() = default;
  void feed_stack(Stack st, uint8_t c, std::vector<Stack>& out) const;
  bool step(const State& from, uint8_t c, State& to) const;  // one byte; false: dead
  static bool stack_complete(const Stack& st, const JsonConstraint& g);
  std::vector<Node> nodes_;
  std::vector<std::string> literals_;
  std::shared_ptr<const TokenBytes> vocab_;
  int32_t root_ = 0, prefix_ = -1, suffix_ = -1;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<const std::vector<uint8_t>>> cache_;
  friend struct JsonSchemaCompiler;
};

}  // namespace tpu::serve
