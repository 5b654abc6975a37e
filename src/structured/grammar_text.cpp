// The grammar parsers' shared reading of text, and GrammarSource's bookkeeping.
#include "structured/grammar_text.h"

#include <fmt/format.h>

#include <algorithm>

namespace deepinfer::structured {

bool GrammarCursor::take(std::string_view word) {
  if (text_.substr(at_, word.size()) != word) return false;
  at_ += word.size();
  return true;
}

GrammarError GrammarCursor::error(std::string_view what) const {
  const size_t line =
      1 + static_cast<size_t>(std::count(
              text_.begin(),
              text_.begin() + static_cast<std::ptrdiff_t>(std::min(at_, text_.size())), '\n'));
  return GrammarError(fmt::format("{} grammar, line {}: {}", syntax_, line, what));
}

uint32_t GrammarCursor::hex(int digits) {
  uint32_t code = 0;
  for (int i = 0; i < digits; ++i) {
    const char c = peek();
    uint32_t value = 0;
    if (c >= '0' && c <= '9') {
      value = static_cast<uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      value = static_cast<uint32_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      value = static_cast<uint32_t>(c - 'A' + 10);
    } else {
      throw error(fmt::format("expected {} hex digits in an escape", digits));
    }
    code = code * 16 + value;
    advance();
  }
  if (code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))
    throw error(fmt::format("escape U+{:X} is not a character", code));
  return code;
}

uint32_t GrammarCursor::character() {
  if (done()) throw error("unexpected end of the grammar");
  const auto lead = static_cast<unsigned char>(peek());
  if (lead == '\\') {
    advance();
    const char c = peek();
    advance();
    switch (c) {
      case 'n':
        return '\n';
      case 't':
        return '\t';
      case 'r':
        return '\r';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case '0':
        return 0;
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case 'U':
        return hex(8);
      default:
        if (c > ' ' && c < 0x7F &&
            !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
          return static_cast<uint8_t>(c);
        throw error(fmt::format("unknown escape '\\{}'", c));
    }
  }
  const size_t length = lead < 0x80    ? 1
                        : lead >= 0xF0 ? 4
                        : lead >= 0xE0 ? 3
                        : lead >= 0xC0 ? 2
                                       : 0;
  std::vector<uint32_t> code;
  if (length == 0 || !decode_utf8(text_.substr(at_, length), code) || code.size() != 1)
    throw error("the grammar is not valid UTF-8");
  at_ += length;
  return code[0];
}

void GrammarCursor::repeat_bounds(int& min, int& max, int limit) {
  advance();  // '{'
  auto number = [&] {
    if (peek() < '0' || peek() > '9') throw error("expected a number in a repeat's bounds");
    long value = 0;
    while (peek() >= '0' && peek() <= '9') {
      value = value * 10 + (peek() - '0');
      if (value > limit) throw error(fmt::format("a repeat bound above {}", limit));
      advance();
    }
    return static_cast<int>(value);
  };
  while (peek() == ' ') advance();
  min = number();
  max = min;
  while (peek() == ' ') advance();
  if (take(",")) {
    while (peek() == ' ') advance();
    max = peek() == '}' ? -1 : number();
    while (peek() == ' ') advance();
  }
  if (!take("}")) throw error("expected '}' after a repeat's bounds");
  if (max >= 0 && max < min) throw error("a repeat's upper bound is below its lower bound");
}

void check_grammar_size(std::string_view text) {
  if (text.size() > GrammarSource::kMaxGrammarBytes)
    throw GrammarError(fmt::format("grammar: {} bytes, more than the {} allowed", text.size(),
                                   GrammarSource::kMaxGrammarBytes));
}

RegexNode code_point_sequence(RegexTree& tree, const std::vector<uint32_t>& codes) {
  RegexNode sequence;
  sequence.kind = RegexNode::Kind::kConcat;
  for (uint32_t code : codes) {
    RegexNode one;
    one.kind = RegexNode::Kind::kChars;
    one.chars = {{code, code}};
    sequence.children.push_back(tree.add(std::move(one)));
  }
  return sequence;
}

RegexNode any_char() {
  RegexNode node;
  node.kind = RegexNode::Kind::kChars;
  node.chars = complement_code_points({});
  return node;
}

int graft(RegexTree& into, const RegexTree& from) {
  const int offset = static_cast<int>(into.nodes.size());
  for (RegexNode node : from.nodes) {
    for (int& child : node.children) child += offset;
    into.nodes.push_back(std::move(node));
  }
  return from.root + offset;
}

int GrammarSource::add(GrammarExpr expr) {
  if (exprs.size() >= kMaxExprs)
    throw GrammarError(fmt::format("grammar: more than {} expressions", kMaxExprs));
  exprs.push_back(std::move(expr));
  return static_cast<int>(exprs.size()) - 1;
}

int GrammarSource::add_terminal(int node) {
  GrammarExpr expr;
  expr.kind = GrammarExpr::Kind::kTerminal;
  expr.terminal = node;
  return add(std::move(expr));
}

int GrammarSource::add_repeat(int child, int min, int max) {
  GrammarExpr expr;
  expr.kind = GrammarExpr::Kind::kRepeat;
  expr.children = {child};
  expr.min = min;
  expr.max = max;
  return add(std::move(expr));
}

int GrammarSource::rule_named(std::string_view name) {
  if (auto found = rule_index.find(name); found != rule_index.end()) return found->second;
  rules.push_back({std::string(name), -1});
  const int index = static_cast<int>(rules.size()) - 1;
  rule_index.emplace(std::string(name), index);
  return index;
}

GrammarSource parse_grammar(std::string_view text) {
  // GBNF defines its start rule `root ::=`; Lark never writes "::=".
  if (text.find("::=") != std::string_view::npos) return GrammarSource::parse_gbnf(text);
  return GrammarSource::parse_lark(text);
}

}  // namespace deepinfer::structured
