// Pre-tokenizers of tokenizer.json: how text is cut into pieces before the model sees them.
#include <array>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/components.h"
#include "tokenizer/text.h"

namespace deepinfer::tokenization {
namespace {

using Span = std::pair<size_t, size_t>;

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const Json& description) {
  std::string name = description.value("behavior", std::string("Isolated"));
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  fail("tokenizer.json: split behavior \"{}\" is not supported", name);
}

// Cuts a piece of `length` bytes at `matches` (sorted, non-overlapping, relative to the piece)
// the way transformers' split does: gaps and matches alternate, then the behaviour decides
// what stays and what merges. Kept spans go to `out`, shifted by `offset`.
void split_piece(size_t offset, size_t length, const std::vector<Span>& matches, Behavior behavior,
                 bool invert, std::vector<Span>& out) {
  std::vector<std::pair<Span, bool>> parts;
  size_t last = 0;
  for (auto [begin, end] : matches) {
    if (begin > last) parts.push_back({{last, begin}, invert});
    parts.push_back({{begin, end}, !invert});
    last = end;
  }
  if (last < length) parts.push_back({{last, length}, invert});
  std::vector<Span> kept;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kRemoved:
      for (auto& [span, is_match] : parts)
        if (!is_match) kept.push_back(span);
      break;
    case Behavior::kIsolated:
      for (auto& [span, is_match] : parts) kept.push_back(span);
      break;
    case Behavior::kContiguous:
      for (auto& [span, is_match] : parts) {
        if (is_match && previous_match) {
          kept.back().second = span.second;
        } else {
          kept.push_back(span);
        }
        previous_match = is_match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (auto& [span, is_match] : parts) {
        if (is_match && !previous_match && !kept.empty()) {
          kept.back().second = span.second;
        } else {
          kept.push_back(span);
        }
        previous_match = is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->second && !previous_match && !kept.empty()) {
          kept.back().first = it->first.first;
        } else {
          kept.push_back(it->first);
        }
        previous_match = it->second;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  for (auto [begin, end] : kept) {
    if (end > begin) out.emplace_back(offset + begin, offset + end);
  }
}

// Runs `find` over every piece and splits each by its matches.
template <typename Find>
void split_all(Pieces& pieces, Behavior behavior, bool invert, Find find) {
  std::vector<Span> out;
  out.reserve(pieces.spans.size() * 2);
  for (size_t i = 0; i < pieces.spans.size(); ++i) {
    std::string_view piece = pieces.piece(i);
    split_piece(pieces.spans[i].first, piece.size(), find(piece), behavior, invert, out);
  }
  pieces.spans = std::move(out);
}

// Rebuilds the buffer piece by piece through `rewrite(piece, out)`.
template <typename Rewrite>
void rewrite_all(Pieces& pieces, Rewrite rewrite) {
  std::string text;
  text.reserve(pieces.text.size() * 2);
  std::vector<Span> spans;
  spans.reserve(pieces.spans.size());
  for (size_t i = 0; i < pieces.spans.size(); ++i) {
    size_t begin = text.size();
    rewrite(i, pieces.piece(i), text);
    if (text.size() > begin) spans.emplace_back(begin, text.size());
  }
  pieces.text = std::move(text);
  pieces.spans = std::move(spans);
}

std::vector<Span> find_literal(std::string_view piece, const std::string& literal) {
  std::vector<Span> matches;
  for (size_t at = piece.find(literal); at != std::string::npos;
       at = piece.find(literal, at + literal.size())) {
    matches.emplace_back(at, at + literal.size());
  }
  return matches;
}

// Each character for which `is_match` holds is a match of its own.
template <typename Predicate>
std::vector<Span> find_chars(std::string_view piece, Predicate is_match) {
  std::vector<Span> matches;
  for (size_t i = 0; i < piece.size();) {
    size_t length = static_cast<size_t>(text::utf8_length(static_cast<unsigned char>(piece[i])));
    if (is_match(text::code_point_at(piece, i))) matches.emplace_back(i, i + length);
    i += length;
  }
  return matches;
}

class Split final : public PreTokenizer {
 public:
  explicit Split(const Json& description)
      : behavior_(parse_behavior(description)), invert_(description.value("invert", false)) {
    const Json& pattern = description.at("pattern");
    if (pattern.contains("Regex")) {
      regex_ = std::make_unique<text::Regex>(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String")) {
      literal_ = pattern["String"].get<std::string>();
      if (literal_.empty()) fail("tokenizer.json: Split with an empty pattern");
    } else {
      fail("tokenizer.json: Split pattern must be String or Regex");
    }
  }
  void split(Pieces& pieces, bool) const override {
    split_all(pieces, behavior_, invert_, [&](std::string_view piece) {
      return regex_ ? regex_->find_all(piece) : find_literal(piece, literal_);
    });
  }

 private:
  Behavior behavior_;
  bool invert_;
  std::unique_ptr<text::Regex> regex_;
  std::string literal_;
};

const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel final : public PreTokenizer {
 public:
  explicit ByteLevel(const Json& description)
      : add_prefix_space_(description.value("add_prefix_space", true)) {
    if (description.value("use_regex", true)) regex_ = std::make_unique<text::Regex>(kGpt2Pattern);
  }
  void split(Pieces& pieces, bool) const override {
    if (add_prefix_space_) {
      rewrite_all(pieces, [](size_t, std::string_view piece, std::string& out) {
        if (piece.empty() || piece[0] != ' ') out += ' ';
        out += piece;
      });
    }
    if (regex_) {
      split_all(pieces, Behavior::kIsolated, false,
                [&](std::string_view piece) { return regex_->find_all(piece); });
    }
    const std::vector<std::string>& map = byte_to_char();
    rewrite_all(pieces, [&](size_t, std::string_view piece, std::string& out) {
      for (unsigned char byte : piece) out += map[byte];
    });
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<text::Regex> regex_;
};

class Digits final : public PreTokenizer {
 public:
  explicit Digits(const Json& description)
      : individual_(description.value("individual_digits", false)) {}
  void split(Pieces& pieces, bool) const override {
    split_all(pieces, individual_ ? Behavior::kIsolated : Behavior::kContiguous, false,
              [](std::string_view piece) {
                return find_chars(piece, [](char32_t c) { return text::is_digit(c); });
              });
  }

 private:
  bool individual_;
};

class Punctuation final : public PreTokenizer {
 public:
  explicit Punctuation(const Json& description) : behavior_(parse_behavior(description)) {}
  void split(Pieces& pieces, bool) const override {
    split_all(pieces, behavior_, false, [](std::string_view piece) {
      return find_chars(piece, [](char32_t c) { return text::is_punctuation(c); });
    });
  }

 private:
  Behavior behavior_;
};

// Whitespace: keeps runs of word characters and runs of other non-space characters.
class Whitespace final : public PreTokenizer {
 public:
  Whitespace() : regex_(R"(\w+|[^\w\s]+)") {}
  void split(Pieces& pieces, bool) const override {
    split_all(pieces, Behavior::kRemoved, true,
              [&](std::string_view piece) { return regex_.find_all(piece); });
  }

 private:
  text::Regex regex_;
};

class WhitespaceSplit final : public PreTokenizer {
 public:
  void split(Pieces& pieces, bool) const override {
    split_all(pieces, Behavior::kRemoved, false, [](std::string_view piece) {
      return find_chars(piece, [](char32_t c) { return text::is_whitespace(c); });
    });
  }
};

// Spaces become the word marker (U+2581 by default), prepended per prepend_scheme, and with
// `split` each marker starts a new piece.
class Metaspace final : public PreTokenizer {
 public:
  explicit Metaspace(const Json& description)
      : replacement_(description.value("replacement", std::string("\xe2\x96\x81"))),
        scheme_(description.value("prepend_scheme", std::string("always"))),
        split_(description.value("split", true)) {
    if (scheme_ != "always" && scheme_ != "first" && scheme_ != "never")
      fail("tokenizer.json: Metaspace prepend_scheme \"{}\" is not supported", scheme_);
  }
  void split(Pieces& pieces, bool first) const override {
    rewrite_all(pieces, [&](size_t index, std::string_view piece, std::string& out) {
      bool prepend = scheme_ == "always" || (scheme_ == "first" && first && index == 0);
      if (prepend && piece.substr(0, replacement_.size()) != replacement_ &&
          !(piece.size() > 0 && piece[0] == ' ')) {
        out += replacement_;
      }
      for (char ch : piece) {
        if (ch == ' ') {
          out += replacement_;
        } else {
          out += ch;
        }
      }
    });
    if (split_) {
      split_all(pieces, Behavior::kMergedWithNext, false,
                [&](std::string_view piece) { return find_literal(piece, replacement_); });
    }
  }

 private:
  std::string replacement_, scheme_;
  bool split_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> stages)
      : stages_(std::move(stages)) {}
  void split(Pieces& pieces, bool first) const override {
    for (const auto& stage : stages_) stage->split(pieces, first);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> stages_;
};

}  // namespace

const std::vector<std::string>& byte_to_char() {
  static const std::vector<std::string> map = [] {
    std::array<char32_t, 256> code{};
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[static_cast<size_t>(b)] = true;
    for (int b = 0xa1; b <= 0xac; ++b) printable[static_cast<size_t>(b)] = true;
    for (int b = 0xae; b <= 0xff; ++b) printable[static_cast<size_t>(b)] = true;
    char32_t next = 256;
    for (size_t b = 0; b < 256; ++b) code[b] = printable[b] ? static_cast<char32_t>(b) : next++;
    std::vector<std::string> result;
    for (char32_t c : code) result.push_back(text::utf8_encode(c));
    return result;
  }();
  return map;
}

int char_to_byte(char32_t c) {
  static const std::vector<int> inverse = [] {
    std::vector<int> table(512, -1);
    const std::vector<std::string>& map = byte_to_char();
    for (int b = 0; b < 256; ++b) table[text::code_point_at(map[static_cast<size_t>(b)], 0)] = b;
    return table;
  }();
  return c < inverse.size() ? inverse[c] : -1;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& description) {
  if (description.is_null()) return nullptr;
  if (!description.is_object() || !description.contains("type"))
    fail("tokenizer.json: pre_tokenizer has no \"type\"");
  std::string type = description["type"].get<std::string>();
  if (type == "Split") return std::make_unique<Split>(description);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(description);
  if (type == "Digits") return std::make_unique<Digits>(description);
  if (type == "Punctuation") return std::make_unique<Punctuation>(description);
  if (type == "Whitespace") return std::make_unique<Whitespace>();
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplit>();
  if (type == "Metaspace") return std::make_unique<Metaspace>(description);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> stages;
    for (const Json& stage : description.at("pretokenizers")) {
      if (auto made = make_pre_tokenizer(stage)) stages.push_back(std::move(made));
    }
    return std::make_unique<Sequence>(std::move(stages));
  }
  fail(
      "tokenizer.json: pre_tokenizer type \"{}\" is not supported (supported: Split, ByteLevel, "
      "Digits, Punctuation, Whitespace, WhitespaceSplit, Metaspace, Sequence)",
      type);
}

}  // namespace deepinfer::tokenization
