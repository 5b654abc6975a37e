// The pipeline stages of a tokenizer.json, each built from its JSON description. Internal to
// the tokenizer module; `Tokenizer` (tokenizer.h) strings them together.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::tokenization {

using Json = nlohmann::json;

// Rewrites a stretch of input text (Unicode normalization, replacements, ...).
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string apply(std::string text) const = 0;
};

// Text cut into pieces: spans [begin, end) of one buffer, so splitting copies nothing.
struct Pieces {
  std::string text;
  std::vector<std::pair<size_t, size_t>> spans;

  explicit Pieces(std::string_view whole) : text(whole) {
    if (!text.empty()) spans.emplace_back(0, text.size());
  }
  std::string_view piece(size_t index) const {
    return std::string_view(text).substr(spans[index].first,
                                         spans[index].second - spans[index].first);
  }
};

// Cuts text into pieces; runs over every piece the previous stages left. `first` is set for
// the first stretch of the input (Metaspace's prepend_scheme "first").
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void split(Pieces& pieces, bool first) const = 0;
};

// Turns token strings back into text, as a chain over the whole list.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode(std::vector<std::string>& tokens) const = 0;
  // As decode, except that bytes which are not valid UTF-8 stay as they are (what one token
  // of a multi-token character contributes).
  virtual void decode_bytes(std::vector<std::string>& tokens) const { decode(tokens); }
};

// Each maker throws Error naming the component ("normalizer type \"X\" is not supported") for
// anything it does not implement. A null description gives nullptr (no stage).
std::unique_ptr<Normalizer> make_normalizer(const Json& description);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& description);
std::unique_ptr<Decoder> make_decoder(const Json& description);

// What add_special_tokens adds around a single sequence (TemplateProcessing's "single").
struct PostProcessor {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};
PostProcessor make_post_processor(const Json& description);

// GPT-2's reversible byte <-> printable character map used by ByteLevel stages.
// A token id from tokenizer.json: an integer in [0, 2^24], else an Error naming `what`. Reading
// a float or a huge number as an int would be undefined, so nothing else is converted.
int32_t token_id(const Json& value, const std::string& what);

const std::vector<std::string>& byte_to_char();
int char_to_byte(char32_t c);  // -1 when c is not one of the 256 characters

}  // namespace deepinfer::tokenization
