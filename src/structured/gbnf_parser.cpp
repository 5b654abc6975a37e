// GBNF, llama.cpp's grammar syntax: a recursive-descent parser from text to GrammarSource.
// Line breaks are white space anywhere (a rule ends where the next `name ::=` starts), so both
// llama.cpp's one-rule-a-line style and grammars that wrap long rules parse.
#include <fmt/format.h>

#include <algorithm>

#include "structured/grammar.h"
#include "structured/grammar_text.h"

namespace deepinfer::structured {
namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, GrammarSource& out) : in_(text, "gbnf"), out_(out) {}

  void parse() {
    skip_space();
    while (!in_.done()) {
      rule();
      skip_space();
    }
    out_.start = out_.rule_named("root");
  }

 private:
  void rule() {
    const std::string name = this->name();
    skip_space();
    if (!in_.take("::=")) throw in_.error(fmt::format("expected '::=' after rule name '{}'", name));
    const int index = out_.rule_named(name);
    if (out_.rules[static_cast<size_t>(index)].body >= 0)
      throw in_.error(fmt::format("rule '{}' is defined twice", name));
    skip_space();
    const int body = alternation(0);
    out_.rules[static_cast<size_t>(index)].body = body;
  }

  std::string name() {
    const size_t begin = in_.at();
    while (!in_.done() && is_name_char(in_.peek())) in_.advance();
    if (in_.at() == begin) throw in_.error("expected a rule name");
    return std::string(in_.text().substr(begin, in_.at() - begin));
  }

  // '#' comments and white space, line breaks included.
  void skip_space() {
    while (!in_.done()) {
      const char c = in_.peek();
      if (c == '#') {
        while (!in_.done() && in_.peek() != '\n') in_.advance();
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        in_.advance();
      } else {
        return;
      }
    }
  }

  // The next word is a rule being defined: `name ::=`.
  bool at_rule_start() const {
    size_t at = in_.at();
    const std::string_view text = in_.text();
    while (at < text.size() && is_name_char(text[at])) ++at;
    if (at == in_.at()) return false;
    while (at < text.size() && (text[at] == ' ' || text[at] == '\t')) ++at;
    return text.substr(at, 3) == "::=";
  }

  int alternation(int depth) {
    return parse_alternatives(
        in_, out_, depth, [this](int d) { return sequence(d); }, [this] { skip_space(); });
  }

  int sequence(int depth) {
    GrammarExpr items;
    items.kind = GrammarExpr::Kind::kSequence;
    while (!in_.done()) {
      const char c = in_.peek();
      if (c == '|' || c == ')' || (depth == 0 && at_rule_start())) break;
      items.children.push_back(postfix(element(depth)));
      skip_space();
    }
    if (items.children.size() == 1) return items.children[0];
    return out_.add(std::move(items));
  }

  int element(int depth) {
    const char c = in_.peek();
    if (c == '"') return terminal(literal());
    if (c == '[') return terminal(char_class());
    if (c == '.') {
      in_.advance();
      return terminal(out_.terminals.add(any_char()));
    }
    if (c == '(') {
      in_.advance();
      skip_space();
      const int group = alternation(depth + 1);
      if (!in_.take(")")) throw in_.error("expected ')'");
      return group;
    }
    if (c == '<' || c == '!')
      throw in_.error("token references (<...>) are not supported; write the token's text");
    if (is_name_char(c)) {
      GrammarExpr ref;
      ref.kind = GrammarExpr::Kind::kRule;
      ref.rule = out_.rule_named(name());
      return out_.add(std::move(ref));
    }
    throw in_.error(fmt::format("unexpected '{}'", c));
  }

  int terminal(int node) { return out_.add_terminal(node); }

  int postfix(int child) {
    skip_inline_space();
    int min = 0, max = 0;
    if (in_.take("*")) {
      min = 0, max = -1;
    } else if (in_.take("+")) {
      min = 1, max = -1;
    } else if (in_.take("?")) {
      min = 0, max = 1;
    } else if (in_.peek() == '{') {
      in_.repeat_bounds(min, max, GrammarSource::kMaxRepeat);
    } else {
      return child;
    }
    return postfix(out_.add_repeat(child, min, max));
  }

  void skip_inline_space() {
    while (!in_.done() && (in_.peek() == ' ' || in_.peek() == '\t')) in_.advance();
  }

  int literal() {
    in_.advance();  // '"'
    std::vector<uint32_t> codes;
    while (true) {
      if (in_.done() || in_.peek() == '\n') throw in_.error("unterminated string literal");
      if (in_.take("\"")) break;
      codes.push_back(in_.character());
    }
    return out_.terminals.add(code_point_sequence(out_.terminals, codes));
  }

  int char_class() {
    in_.advance();  // '['
    const bool negated = in_.take("^");
    Ranges ranges;
    while (!in_.take("]")) {
      if (in_.done()) throw in_.error("unterminated character class");
      const uint32_t low = in_.character();
      uint32_t high = low;
      if (in_.peek() == '-' && in_.peek(1) != ']') {
        in_.advance();
        high = in_.character();
        if (high < low) throw in_.error("a character range runs backwards");
      }
      ranges.emplace_back(low, high);
    }
    RegexNode node;
    node.kind = RegexNode::Kind::kChars;
    node.chars = negated ? complement_code_points(ranges) : normalised_code_points(ranges);
    if (node.chars.empty()) throw in_.error("a character class matches nothing");
    return out_.terminals.add(std::move(node));
  }

  GrammarCursor in_;
  GrammarSource& out_;
};

}  // namespace

GrammarSource GrammarSource::parse_gbnf(std::string_view text) {
  check_grammar_size(text);
  GrammarSource source;
  GbnfParser(text, source).parse();
  return source;
}

}  // namespace deepinfer::structured
