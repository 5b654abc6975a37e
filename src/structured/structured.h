// Output constrained to a grammar: for each completion a matcher says which tokens may come
// next (as a mask over the logits) and follows the tokens that came: one JSON object
// (response_format json_object), a JSON Schema, a regular expression or a list of choices,
// each behind the same Constraint/Matcher seam.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::structured {

// Tokens in byte order, each with the length of the prefix it shares with the one before it,
// and the least of those lengths over blocks of tokens, so that a walk that finds a prefix dead
// jumps past every token below it instead of stepping over them one by one.
class SortedTokens {
 public:
  using Entry = std::pair<int32_t, uint32_t>;  // token id, bytes shared with the one before
  SortedTokens() = default;
  explicit SortedTokens(std::vector<Entry> entries);
  size_t size() const { return entries_.size(); }
  const Entry& operator[](size_t i) const { return entries_[i]; }
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }
  // The first position from `from` on whose token shares at most `depth` bytes with the one
  // before it (size() when none): the next token not below the previous one's first depth + 1
  // bytes.
  size_t next_within(size_t from, uint32_t depth) const;

 private:
  static constexpr size_t kBlock = 64, kSuperBlock = 4096;
  std::vector<Entry> entries_;
  std::vector<uint32_t> block_min_, super_block_min_;
};

// The vocabulary as the bytes each token writes, sorted so that a matcher checks a prefix
// shared by many tokens once. Built once per model (Tokenizer::token_bytes()).
class TokenTable {
 public:
  // `forbidden` tokens (control tokens) never match; `end_tokens` (EOS) match only where the
  // grammar is complete.
  TokenTable(std::vector<std::string> token_bytes, const std::vector<int32_t>& end_tokens,
             const std::vector<int32_t>& forbidden);
  // The 256 single bytes as tokens 0-255 and an end token, 256: for checking a grammar's
  // language byte by byte (tests, fuzzing, coverage runs).
  static std::shared_ptr<const TokenTable> single_bytes();
  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_end(int32_t id) const { return kind_[static_cast<size_t>(id)] == Kind::kEnd; }
  // Ordinary tokens in byte order.
  const SortedTokens& sorted() const { return sorted_; }
  // Inside a JSON string most tokens are just characters: those without '"', '\\' or control
  // bytes that are well-formed UTF-8 from a character boundary (allowed between characters
  // whatever came before); string_sensitive are the others that can continue a string (no
  // control byte before their first '"' or '\\'), sorted as above.
  const std::vector<int32_t>& string_plain() const { return string_plain_; }
  const SortedTokens& string_plain_sorted() const { return string_plain_sorted_; }
  // The code points each string_plain token writes (its bytes that do not continue one).
  const std::vector<uint32_t>& string_plain_chars() const { return string_plain_chars_; }
  // Marks in `allowed` (bits by token id) the string_plain tokens of at most `max_chars` code
  // points and `max_bytes` bytes that `filter` (bits by token id; null: any) marks: word by
  // word from bits made once, not token by token.
  void allow_string_plain(int64_t max_chars, int64_t max_bytes, const std::vector<uint64_t>* filter,
                          std::vector<uint64_t>& allowed) const;
  const SortedTokens& string_sensitive() const { return string_sensitive_; }
  // The tokens of one byte, sorted: a mask that must stop early checks these first, so that
  // output can always go on a byte at a time.
  const SortedTokens& one_byte_tokens() const { return one_byte_tokens_; }
  const std::vector<int32_t>& end_tokens() const { return end_tokens_; }

  // Token bits (by id) worked out from an automaton state, kept for every constraint of this
  // vocabulary: the same formats and terminals recur across schemas, grammars and requests.
  // `key`: the automaton's fingerprint, its state, and what the bits mean. At most
  // kMaxSharedBits are kept (19 KB each for a 151k vocabulary), then the cache starts over.
  using Bits = std::shared_ptr<const std::vector<uint64_t>>;
  using BitsKey = std::array<uint64_t, 4>;
  static constexpr size_t kMaxSharedBits = 1024;
  Bits shared_bits(const BitsKey& key, const std::function<std::vector<uint64_t>()>& make) const;

 private:
  enum class Kind : uint8_t { kText, kEnd, kForbidden };
  SortedTokens with_shared_prefixes(const std::vector<int32_t>& order) const;
  void index_string_plain();
  std::vector<std::string> bytes_;
  std::vector<Kind> kind_;
  SortedTokens sorted_, string_sensitive_, string_plain_sorted_, one_byte_tokens_;
  std::vector<int32_t> string_plain_;
  std::vector<uint32_t> string_plain_chars_;
  // plain_within_[k]: bits of the string_plain tokens of at most k code points (the last: all);
  // longer tokens one by one from plain_long_.
  static constexpr uint32_t kCountedChars = 16;
  std::vector<std::vector<uint64_t>> plain_within_;
  std::vector<std::pair<int32_t, uint32_t>> plain_long_;  // (id, code points)
  uint32_t plain_max_chars_ = 0;
  size_t plain_max_bytes_ = 0;
  std::vector<int32_t> end_tokens_;
  mutable std::mutex shared_mutex_;
  mutable std::map<BitsKey, Bits> shared_bits_;
};

// The tokens that may come next: bits by token id (64 a word) over the first `tokens` ids,
// every id from `tokens` on banned (the model's padding rows). No bits: any token may come.
// The bits are shared and never change, so a mask can be made on one thread and applied on
// another, or copied to where the logits are.
struct TokenMask {
  std::shared_ptr<const std::vector<uint64_t>> bits;
  int32_t tokens = 0;
  bool free() const { return bits == nullptr; }
  // Whether `token` may come.
  bool allows(int32_t token) const {
    if (free()) return token >= 0;
    return token >= 0 && token < tokens &&
           ((*bits)[static_cast<size_t>(token) / 64] >> (token % 64) & 1);
  }
  // Whether any id below `vocab_size` may come.
  bool allows_any(int32_t vocab_size) const;
};

// One completion's place in its grammar.
class Matcher {
 public:
  virtual ~Matcher() = default;
  virtual std::unique_ptr<Matcher> clone() const = 0;
  // Which tokens may come next. Reads the matcher only (masks kept by a compiled grammar are
  // shared under its own lock), so it may run beside the forward that makes the logits.
  virtual TokenMask allowed() const = 0;
  // Sets the logit of every token that may not come next to -infinity.
  void mask_logits(float* logits, int32_t vocab_size) const {
    apply(allowed(), logits, vocab_size);
  }
  static void apply(const TokenMask& mask, float* logits, int32_t vocab_size);
  // Follows a sampled token; false when it breaks the grammar (then the matcher is unchanged).
  virtual bool accept(int32_t token) = 0;
  // The output so far is a complete sentence of the grammar.
  virtual bool complete() const = 0;
};

// What a request's output must be; starts one matcher per completion.
class Constraint {
 public:
  virtual ~Constraint() = default;
  virtual std::unique_ptr<Matcher> start() const = 0;
};

// One JSON object (RFC 8259 syntax), optionally surrounded by whitespace, then an end token.
// Runs of whitespace are capped so that a model cannot pad forever.
std::shared_ptr<const Constraint> json_object_constraint(std::shared_ptr<const TokenTable> table);

// One JSON value that `schema_json` (JSON Schema, drafts 2020-12 and 7) accepts, then an end
// token. Throws GrammarError naming a keyword or construct it cannot enforce, among them a
// oneOf whose branches it cannot show to share no value.
std::shared_ptr<const Constraint> json_schema_constraint(std::shared_ptr<const TokenTable> table,
                                                         std::string_view schema_json);

// The whole output matches `pattern` (see regex.h for the syntax), then an end token. Throws
// GrammarError for a pattern it refuses.
std::shared_ptr<const Constraint> regex_constraint(std::shared_ptr<const TokenTable> table,
                                                   std::string_view pattern);
// The whole output is a sentence of `grammar`: GBNF (llama.cpp's syntax, start rule `root`)
// or Lark's EBNF (start rule `start`; see grammar.h), then an end token. Throws GrammarError
// for a grammar it refuses.
std::shared_ptr<const Constraint> grammar_constraint(std::shared_ptr<const TokenTable> table,
                                                     std::string_view grammar);
// The whole output is exactly one of `choices`, then an end token.
std::shared_ptr<const Constraint> choice_constraint(std::shared_ptr<const TokenTable> table,
                                                    const std::vector<std::string>& choices);

// `inner`, then any output once it is complete: a forced tool call's arguments, after which the
// model closes the call in its own format.
std::shared_ptr<const Constraint> then_free(std::shared_ptr<const Constraint> inner);

// `inner`, then exactly the tokens `closing` (what closes a forced tool call in the model's
// format, control tokens included), then an end token alone when `end` (the call is the whole
// output), else any output.
std::shared_ptr<const Constraint> then_closing(std::shared_ptr<const Constraint> inner,
                                               const TokenTable& table,
                                               std::vector<int32_t> closing, bool end);

// Free output in which each `trigger` token starts `inner` (then free again once it is
// complete): a tool call's block opened by its tag, its call object held to the tools' schemas.
std::shared_ptr<const Constraint> after_each(int32_t trigger,
                                             std::shared_ptr<const Constraint> inner);

// `inner` after the model's reasoning: a prompt that opened the reasoning, or a first token
// `reasoning_start`, leaves the output free until the token `reasoning_end`; any other first
// token starts `inner` at once.
std::shared_ptr<const Constraint> after_reasoning(std::shared_ptr<const Constraint> inner,
                                                  int32_t reasoning_start, int32_t reasoning_end,
                                                  bool starts_in_reasoning);

}  // namespace deepinfer::structured
