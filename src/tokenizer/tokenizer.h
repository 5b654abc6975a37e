// Hugging Face tokenizer.json, reproduced exactly: encode in three trust levels, decode, and
// streaming detokenization.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer {

// How much of the added vocabulary (control tokens) is recognised in the text.
enum class EncodeMode {
  kSpecials,  // every added token: for text that comes from a chat template
  kAsText,    // tokens flagged special stay text (transformers' split_special_tokens=True)
  kPlain,     // no added vocabulary: for anything a client sent
};

class Tokenizer {
 public:
  // Reads `folder`/tokenizer.json and, when present, tokenizer_config.json. Anything
  // unsupported or malformed is an Error naming the file and component.
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& folder);
  // From tokenizer.json text (and tokenizer_config.json text, may be empty).
  static std::unique_ptr<Tokenizer> from_json(const std::string& tokenizer_json,
                                              const std::string& config_json);
  ~Tokenizer();

  // Text must be valid UTF-8 (else Error). add_special_tokens applies the post-processor
  // (e.g. a leading BOS), as transformers' add_special_tokens=True.
  std::vector<int32_t> encode(std::string_view text, EncodeMode mode = EncodeMode::kSpecials,
                              bool add_special_tokens = false) const;
  // As encode(kSpecials), except that no added token is recognised where it would overlap one
  // of `plain` (byte ranges [first, second) of text a client typed): the text there is
  // encoded as ordinary text. Elsewhere the result equals encode().
  std::vector<int32_t> encode_with_plain_ranges(
      std::string_view text, const std::vector<std::pair<size_t, size_t>>& plain) const;
  // The content of every added token (what kSpecials recognises in text).
  std::vector<std::string> added_token_contents() const;
  // Ids outside the vocabulary are an Error.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // The bytes each id writes in the middle of a text (index = id), without the UTF-8 repair
  // decode() does: a token holding part of a character gives those bytes. For masks that follow
  // output byte by byte.
  std::vector<std::string> token_bytes() const;

  // Forgets the cached encodings of frequent words (for memory, or for cold benchmarks).
  void clear_cache() const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;
  int32_t vocab_size() const;
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;  // from the added vocabulary (control tokens and the like)
  // Tokens named by tokenizer_config.json ("" when absent).
  const std::string& bos_token() const;
  const std::string& eos_token() const;

 private:
  std::vector<int32_t> encode_checked(std::string_view text, EncodeMode mode,
                                      bool add_special_tokens,
                                      const std::vector<std::pair<size_t, size_t>>& plain) const;
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  static std::unique_ptr<Tokenizer> build(const std::string& tokenizer_json,
                                          const std::string& config_json);
  std::unique_ptr<Impl> impl_;
};

// Turns a growing list of ids into text pieces as they become final: nothing is emitted
// while the tail is an incomplete UTF-8 character (byte-fallback pieces, characters spread
// over several tokens), and the concatenation of everything emitted equals decode(all ids).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  // Text that became final with this id (often empty).
  std::string push(int32_t id);
  // Whatever is left at the end of the sequence.
  std::string finish();

 private:
  std::pair<std::string, std::string> decode_window() const;

  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // ids_[prefix_offset_, read_offset_) give context for decoding
  size_t read_offset_ = 0;    // ids_ from here on are not emitted yet
};

}  // namespace deepinfer
