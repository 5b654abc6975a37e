// The pattern syntax: a recursive-descent parser from text to RegexTree.
#include <algorithm>

#include "structured/regex.h"

namespace deepinfer::structured {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

const Ranges kDigits{{'0', '9'}};
const Ranges kWord{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMAScript's \s: ASCII white space and the Unicode space separators and line terminators.
const Ranges kSpace{{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680},
                    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                    {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};

class Parser {
 public:
  Parser(std::string_view pattern, RegexTree& tree) : text_(pattern), tree_(tree) {}

  int parse_all() {
    if (peek('^')) ++at_;
    int root = alternation();
    if (at_ < text_.size()) error("unbalanced ')'");
    return root;
  }

  // ECMAScript's search: each top-level alternative matches anywhere in the text unless '^'
  // opens it or '$' closes it, so it is padded with any text on its open sides.
  int parse_search() {
    std::vector<int> options;
    do {
      if (!options.empty()) ++at_;  // the '|'
      const bool starts = peek('^');
      if (starts) ++at_;
      ended_ = false;
      int option = concatenation();
      RegexNode padded;
      padded.kind = RegexNode::Kind::kConcat;
      if (!starts) padded.children.push_back(any_text());
      padded.children.push_back(option);
      if (!ended_) padded.children.push_back(any_text());
      options.push_back(tree_.add(std::move(padded)));
    } while (peek('|'));
    if (at_ < text_.size()) error("unbalanced ')'");
    if (options.size() == 1) return options[0];
    RegexNode node;
    node.kind = RegexNode::Kind::kAlternation;
    node.children = std::move(options);
    return tree_.add(std::move(node));
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    throw GrammarError(fmt::format("regex: {} at offset {}", what, at_));
  }
  bool peek(char c) const { return at_ < text_.size() && text_[at_] == c; }
  bool done() const { return at_ >= text_.size(); }

  int alternation() {
    std::vector<int> options{concatenation()};
    while (peek('|')) {
      ++at_;
      options.push_back(concatenation());
    }
    if (options.size() == 1) return options[0];
    RegexNode node;
    node.kind = RegexNode::Kind::kAlternation;
    node.children = std::move(options);
    return tree_.add(std::move(node));
  }

  int concatenation() {
    RegexNode node;
    node.kind = RegexNode::Kind::kConcat;
    while (!done() && !peek('|') && !peek(')')) {
      if (peek('$')) {
        ++at_;
        if (!done() && !peek(')') && !peek('|')) error("'$' inside the pattern is not supported");
        if (depth_ > 0) error("'$' inside a group is not supported");
        ended_ = true;
        continue;
      }
      if (peek('^')) error("'^' inside the pattern is not supported");
      node.children.push_back(quantified(atom()));
    }
    if (node.children.size() == 1) return node.children[0];
    if (node.children.empty()) return tree_.add(RegexNode{});
    return tree_.add(std::move(node));
  }

  int quantified(int atom) {
    while (!done()) {
      int min = 0, max = 0;
      const char c = text_[at_];
      if (c == '*') {
        min = 0, max = -1;
        ++at_;
      } else if (c == '+') {
        min = 1, max = -1;
        ++at_;
      } else if (c == '?') {
        min = 0, max = 1;
        ++at_;
      } else if (c == '{' && bounds(min, max)) {
      } else {
        return atom;
      }
      // Lazy quantifiers match the same language; possessive ones do not.
      if (peek('?')) ++at_;
      if (peek('+')) error("possessive quantifiers are not supported");
      RegexNode node;
      node.kind = RegexNode::Kind::kRepeat;
      node.children = {atom};
      node.min = min;
      node.max = max;
      atom = tree_.add(std::move(node));
    }
    return atom;
  }

  // {n}, {n,}, {n,m}; anything else after '{' is a literal brace, as in ECMAScript.
  bool bounds(int& min, int& max) {
    size_t at = at_ + 1;
    auto number = [&](int& value) {
      size_t begin = at;
      long long parsed = 0;
      while (at < text_.size() && text_[at] >= '0' && text_[at] <= '9') {
        parsed = std::min<long long>(parsed * 10 + (text_[at] - '0'), 1LL << 40);
        ++at;
      }
      value = static_cast<int>(std::min<long long>(parsed, 1 << 30));
      return at > begin;
    };
    if (!number(min)) return false;
    max = min;
    if (at < text_.size() && text_[at] == ',') {
      ++at;
      if (!number(max)) max = -1;
    }
    if (at >= text_.size() || text_[at] != '}') return false;
    at_ = at + 1;
    if (min > RegexTree::kMaxRepeat || max > RegexTree::kMaxRepeat)
      error(fmt::format("a repeat count above {}", RegexTree::kMaxRepeat));
    if (max >= 0 && max < min) error("a repeat range {n,m} with m < n");
    return true;
  }

  int atom() {
    const char c = text_[at_];
    if (c == '(') return group();
    if (c == '[') return chars(char_class());
    if (c == '.') {
      ++at_;
      return chars(complement_code_points({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '\\') return chars(escape(false));
    if (c == '*' || c == '+' || c == '?') error(fmt::format("'{}' with nothing to repeat", c));
    const uint32_t code = code_point();
    return chars({{code, code}});
  }

  int group() {
    ++at_;
    if (peek('?')) {
      ++at_;
      if (peek(':')) {
        ++at_;
      } else if (peek('<') && at_ + 1 < text_.size() && text_[at_ + 1] != '=' &&
                 text_[at_ + 1] != '!') {
        const size_t end = text_.find('>', at_);
        if (end == std::string_view::npos) error("an unterminated group name");
        at_ = end + 1;
      } else {
        error("look-around and inline flags are not supported");
      }
    }
    ++depth_;
    if (depth_ > kMaxDepth) error(fmt::format("groups nested deeper than {}", kMaxDepth));
    const int inner = alternation();
    --depth_;
    if (!peek(')')) error("an unterminated group");
    ++at_;
    return inner;
  }

  Ranges char_class() {
    ++at_;
    const bool negated = peek('^');
    if (negated) ++at_;
    Ranges ranges;
    bool first = true;
    while (!done() && (!peek(']') || first)) {
      first = false;
      Ranges low = member();
      if (low.size() == 1 && low[0].first == low[0].second && peek('-') && at_ + 1 < text_.size() &&
          text_[at_ + 1] != ']') {
        ++at_;
        Ranges high = member();
        if (high.size() != 1 || high[0].first != high[0].second)
          error("a class range must end at one character");
        if (high[0].first < low[0].first) error("a class range out of order");
        ranges.emplace_back(low[0].first, high[0].first);
        continue;
      }
      ranges.insert(ranges.end(), low.begin(), low.end());
    }
    if (!peek(']')) error("an unterminated character class");
    ++at_;
    return negated ? complement_code_points(ranges) : ranges;
  }

  Ranges member() {
    if (peek('\\')) return escape(true);
    if (peek('[') && at_ + 1 < text_.size() && text_[at_ + 1] == ':')
      error("POSIX classes like [:alpha:] are not supported");
    const uint32_t code = code_point();
    return {{code, code}};
  }

  Ranges escape(bool in_class) {
    ++at_;
    if (done()) error("a pattern ending in '\\'");
    const char c = text_[at_++];
    switch (c) {
      case 'd':
        return kDigits;
      case 'D':
        return complement_code_points(kDigits);
      case 'w':
        return kWord;
      case 'W':
        return complement_code_points(kWord);
      case 's':
        return kSpace;
      case 'S':
        return complement_code_points(kSpace);
      case 'n':
        return {{'\n', '\n'}};
      case 't':
        return {{'\t', '\t'}};
      case 'r':
        return {{'\r', '\r'}};
      case 'f':
        return {{'\f', '\f'}};
      case 'v':
        return {{'\v', '\v'}};
      case '0':
        return {{0, 0}};
      case 'x':
        return single(hex(2));
      case 'u':
        return single(unicode_escape());
      case 'b':
        if (in_class) return {{'\b', '\b'}};
        error("word boundaries (\\b) are not supported");
      case 'B':
        error("word boundaries (\\B) are not supported");
      case 'p':
      case 'P':
        error("Unicode property classes (\\p) are not supported");
      default:
        break;
    }
    if (c >= '1' && c <= '9') error("back-references are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      error(fmt::format("the escape '\\{}' is not supported", c));
    --at_;  // an escaped punctuation or non-ASCII character stands for itself
    return single(code_point());
  }

  static Ranges single(uint32_t code) { return {{code, code}}; }

  uint32_t unicode_escape() {
    if (!peek('{')) return hex(4);
    ++at_;
    uint32_t code = 0;
    size_t digits = 0;
    while (!done() && !peek('}')) {
      code = code * 16 + hex_digit(text_[at_++]);
      if (++digits > 6 || code > kMaxCodePoint) error("a code point above U+10FFFF");
    }
    if (!peek('}') || digits == 0) error("an unterminated \\u{...} escape");
    ++at_;
    return code;
  }

  uint32_t hex(int digits) {
    uint32_t code = 0;
    for (int i = 0; i < digits; ++i) {
      if (done()) error("a short hexadecimal escape");
      code = code * 16 + hex_digit(text_[at_++]);
    }
    return code;
  }

  uint32_t hex_digit(char c) const {
    if (c >= '0' && c <= '9') return static_cast<uint32_t>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<uint32_t>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<uint32_t>(c - 'A' + 10);
    error("a bad hexadecimal digit");
  }

  // One UTF-8 encoded character of the pattern.
  uint32_t code_point() {
    const auto lead = static_cast<unsigned char>(text_[at_]);
    int length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
    if (length == 0 || at_ + static_cast<size_t>(length) > text_.size())
      error("the pattern is not valid UTF-8");
    uint32_t code = length == 1 ? lead : lead & (0x7F >> length);
    for (int i = 1; i < length; ++i) {
      const auto next = static_cast<unsigned char>(text_[at_ + static_cast<size_t>(i)]);
      if ((next & 0xC0) != 0x80) error("the pattern is not valid UTF-8");
      code = (code << 6) | (next & 0x3F);
    }
    at_ += static_cast<size_t>(length);
    return code;
  }

  int chars(Ranges ranges) {
    RegexNode node;
    node.kind = RegexNode::Kind::kChars;
    node.chars = normalised_code_points(std::move(ranges));
    return tree_.add(std::move(node));
  }

  static constexpr int kMaxDepth = 200;
  std::string_view text_;
  // Any code point, any number of times.
  int any_text() {
    RegexNode chars;
    chars.kind = RegexNode::Kind::kChars;
    chars.chars = complement_code_points({});
    RegexNode repeat;
    repeat.kind = RegexNode::Kind::kRepeat;
    repeat.children = {tree_.add(std::move(chars))};
    repeat.max = -1;
    return tree_.add(std::move(repeat));
  }

  RegexTree& tree_;
  size_t at_ = 0;
  int depth_ = 0;
  bool ended_ = false;  // the alternative just parsed ended with '$'
};

}  // namespace

std::vector<std::pair<uint32_t, uint32_t>> normalised_code_points(
    std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& range : ranges) {
    if (!merged.empty() && range.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, range.second);
    } else {
      merged.push_back(range);
    }
  }
  return merged;
}

std::vector<std::pair<uint32_t, uint32_t>> complement_code_points(
    const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t next = 0;
  for (const auto& [low, high] : normalised_code_points(ranges)) {
    if (low > next) out.emplace_back(next, low - 1);
    next = high + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  std::vector<std::pair<uint32_t, uint32_t>> without_surrogates;
  for (const auto& [low, high] : out) {
    if (high < 0xD800 || low > 0xDFFF) {
      without_surrogates.emplace_back(low, high);
      continue;
    }
    if (low < 0xD800) without_surrogates.emplace_back(low, 0xD7FF);
    if (high > 0xDFFF) without_surrogates.emplace_back(0xE000, high);
  }
  return without_surrogates;
}

int RegexTree::add(RegexNode node) {
  nodes.push_back(std::move(node));
  return static_cast<int>(nodes.size()) - 1;
}

RegexTree RegexTree::parse(std::string_view pattern) {
  if (pattern.size() > kMaxPatternBytes)
    throw GrammarError(fmt::format("regex: the pattern is {} bytes, more than the {} allowed",
                                   pattern.size(), kMaxPatternBytes));
  RegexTree tree;
  tree.root = Parser(pattern, tree).parse_all();
  return tree;
}

RegexTree RegexTree::parse_search(std::string_view pattern) {
  if (pattern.size() > kMaxPatternBytes)
    throw GrammarError(fmt::format("regex: the pattern is {} bytes, more than the {} allowed",
                                   pattern.size(), kMaxPatternBytes));
  RegexTree tree;
  tree.root = Parser(pattern, tree).parse_search();
  return tree;
}

bool decode_utf8(std::string_view utf8, std::vector<uint32_t>& out) {
  for (size_t at = 0; at < utf8.size();) {
    const auto lead = static_cast<unsigned char>(utf8[at]);
    const size_t length = lead < 0x80    ? 1
                          : lead >= 0xF0 ? 4
                          : lead >= 0xE0 ? 3
                          : lead >= 0xC0 ? 2
                                         : 0;
    if (length == 0 || at + length > utf8.size()) return false;
    uint32_t code = length == 1 ? lead : lead & (0x7Fu >> length);
    for (size_t i = 1; i < length; ++i)
      code = (code << 6) | (static_cast<unsigned char>(utf8[at + i]) & 0x3Fu);
    out.push_back(code);
    at += length;
  }
  return true;
}

int RegexTree::literal(std::string_view utf8) {
  std::vector<uint32_t> codes;
  if (!decode_utf8(utf8, codes)) throw GrammarError("choice: a choice is not valid UTF-8");
  RegexNode concat;
  concat.kind = RegexNode::Kind::kConcat;
  for (uint32_t code : codes) {
    RegexNode one;
    one.kind = RegexNode::Kind::kChars;
    one.chars = {{code, code}};
    concat.children.push_back(add(std::move(one)));
  }
  return add(std::move(concat));
}

RegexTree RegexTree::choice(const std::vector<std::string>& choices) {
  if (choices.empty()) throw GrammarError("choice: the list of choices is empty");
  size_t bytes = 0;
  for (const std::string& text : choices) bytes += text.size();
  if (bytes > kMaxPatternBytes)
    throw GrammarError(fmt::format("choice: the choices hold {} bytes, more than the {} allowed",
                                   bytes, kMaxPatternBytes));
  RegexTree tree;
  RegexNode options;
  options.kind = RegexNode::Kind::kAlternation;
  for (const std::string& text : choices) options.children.push_back(tree.literal(text));
  tree.root = tree.add(std::move(options));
  return tree;
}

}  // namespace deepinfer::structured
