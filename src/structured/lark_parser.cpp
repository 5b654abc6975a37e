// Lark's EBNF: a recursive-descent parser from text to GrammarSource. Rules (lowercase names)
// and terminals (uppercase) both become rules; terminals are regular, so they lower to
// automata. The language is read without Lark's lexer: a token sequence the lexer would split
// another way is still accepted as long as the grammar allows it, and %ignore'd terminals may
// come before each terminal of a rule and at the end of the output.
#include <fmt/format.h>

#include <algorithm>

#include "structured/grammar.h"
#include "structured/grammar_text.h"

namespace deepinfer::structured {
namespace {

// The terminals of Lark's common library that grammars import, defined anew (the lazy and
// look-behind patterns of the originals written as the languages they lex).
constexpr std::string_view kCommonLibrary = R"(
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER
ESCAPED_STRING: /"([^"\\\n]|\\[^\n])*"/
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*
WS_INLINE: (" " | /\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: /\/\*([^*]|\*+[^*\/])*\*+\//
SQL_COMMENT: /--[^\n]*/
)";

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || (c >= '0' && c <= '9');
}
bool is_terminal_name(std::string_view name) {
  return std::none_of(name.begin(), name.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}

class LarkParser {
 public:
  LarkParser(std::string_view text, GrammarSource& out) : in_(text, "lark"), out_(out) {}

  // Definitions and directives; the %ignore'd terminals come back in `ignored`.
  void parse(std::vector<int>& ignored) {
    skip_space();
    while (!in_.done()) {
      if (in_.peek() == '%') {
        directive(ignored);
      } else {
        definition();
      }
      skip_space();
    }
  }

 private:
  void skip_space() {
    while (!in_.done()) {
      const char c = in_.peek();
      if (c == '/' && in_.peek(1) == '/') {
        while (!in_.done() && in_.peek() != '\n') in_.advance();
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        in_.advance();
      } else {
        return;
      }
    }
  }

  std::string name() {
    const size_t begin = in_.at();
    if (!is_name_start(in_.peek())) throw in_.error("expected a name");
    while (!in_.done() && is_name_char(in_.peek())) in_.advance();
    return std::string(in_.text().substr(begin, in_.at() - begin));
  }

  // `name:`, `?name:`, `!name:` or `name.priority:` starts here.
  bool at_definition() const {
    const std::string_view text = in_.text();
    size_t at = in_.at();
    if (at < text.size() && (text[at] == '?' || text[at] == '!')) ++at;
    const size_t begin = at;
    while (at < text.size() && is_name_char(text[at])) ++at;
    if (at == begin) return false;
    if (at < text.size() && text[at] == '.') {
      ++at;
      while (at < text.size() && (text[at] == '-' || (text[at] >= '0' && text[at] <= '9'))) ++at;
    }
    while (at < text.size() && (text[at] == ' ' || text[at] == '\t')) ++at;
    return at < text.size() && text[at] == ':';
  }

  void definition() {
    if (in_.peek() == '?' || in_.peek() == '!') in_.advance();  // tree shaping only
    const std::string name = this->name();
    if (in_.peek() == '{')
      throw in_.error(fmt::format("templates ('{}{{...}}') are not supported", name));
    if (in_.take(".")) {  // a priority: it orders parses, the language stays
      in_.take("-");
      while (in_.peek() >= '0' && in_.peek() <= '9') in_.advance();
    }
    skip_space();
    if (!in_.take(":")) throw in_.error(fmt::format("expected ':' after '{}'", name));
    define(name, [&] { return alternation(0); });
  }

  template <typename Body>
  void define(const std::string& name, Body body) {
    const int index = out_.rule_named(name);
    if (out_.rules[static_cast<size_t>(index)].body >= 0)
      throw in_.error(fmt::format("'{}' is defined twice", name));
    skip_space();
    const int made = body();
    out_.rules[static_cast<size_t>(index)].body = made;
  }

  void directive(std::vector<int>& ignored) {
    in_.advance();  // '%'
    const std::string word = name();
    skip_inline_space();
    if (word == "ignore") {
      ignored.push_back(alternation(0));
    } else if (word == "import") {
      import();
    } else {
      throw in_.error(fmt::format("%{} is not supported", word));
    }
  }

  // %import common.NAME [-> ALIAS] or %import common (A, B, ...).
  void import() {
    const std::string module = name();
    if (module != "common")
      throw in_.error(fmt::format("%import of '{}': only Lark's common library is known", module));
    std::vector<std::pair<std::string, std::string>> names;  // (library name, defined as)
    if (in_.take(".")) {
      const std::string terminal = name();
      skip_inline_space();
      std::string alias = terminal;
      if (in_.take("->")) {
        skip_inline_space();
        alias = name();
      }
      names.emplace_back(terminal, alias);
    } else if (in_.take("(")) {
      do {
        skip_space();
        const std::string terminal = name();
        names.emplace_back(terminal, terminal);
        skip_space();
      } while (in_.take(","));
      if (!in_.take(")")) throw in_.error("expected ')' after the imported names");
    } else {
      throw in_.error("expected '.NAME' or '(NAME, ...)' after %import common");
    }
    for (const auto& [terminal, alias] : names) import_common(terminal, alias);
  }

  void import_common(const std::string& terminal, const std::string& alias) {
    GrammarSource library;
    std::vector<int> none;
    LarkParser(kCommonLibrary, library).parse(none);
    const auto found = library.rule_index.find(terminal);
    if (found == library.rule_index.end())
      throw in_.error(fmt::format("common.{} is not in the common library", terminal));
    // Copy the library's definitions under this grammar's names for them.
    std::vector<int> mapped(library.rules.size(), -1);
    for (size_t r = 0; r < library.rules.size(); ++r)
      mapped[r] = out_.rule_named(
          r == static_cast<size_t>(found->second) ? alias : "__COMMON_" + library.rules[r].name);
    const int node_offset = graft_all(library.terminals);
    const int expr_offset = static_cast<int>(out_.exprs.size());
    for (GrammarExpr expr : library.exprs) {
      for (int& child : expr.children) child += expr_offset;
      if (expr.kind == GrammarExpr::Kind::kTerminal) expr.terminal += node_offset;
      if (expr.kind == GrammarExpr::Kind::kRule) expr.rule = mapped[static_cast<size_t>(expr.rule)];
      out_.add(std::move(expr));
    }
    for (size_t r = 0; r < library.rules.size(); ++r) {
      GrammarSource::Rule& rule = out_.rules[static_cast<size_t>(mapped[r])];
      if (rule.body >= 0 && r == static_cast<size_t>(found->second))
        throw in_.error(fmt::format("'{}' is defined twice", alias));
      rule.body = library.rules[r].body + expr_offset;
    }
  }

  int graft_all(const RegexTree& from) {
    const int offset = static_cast<int>(out_.terminals.nodes.size());
    for (RegexNode node : from.nodes) {
      for (int& child : node.children) child += offset;
      out_.terminals.nodes.push_back(std::move(node));
    }
    return offset;
  }

  void skip_inline_space() {
    while (!in_.done() && (in_.peek() == ' ' || in_.peek() == '\t')) in_.advance();
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
      if (c == '|' || c == ')' || c == ']' || c == '%' || (depth == 0 && at_definition())) break;
      if (in_.take("->")) {  // an alias names the tree node only
        skip_inline_space();
        name();
        skip_space();
        continue;
      }
      items.children.push_back(postfix(element(depth)));
      skip_space();
    }
    if (items.children.size() == 1) return items.children[0];
    return out_.add(std::move(items));
  }

  int element(int depth) {
    const char c = in_.peek();
    if (c == '"') return string_or_range();
    if (c == '/') return regex();
    if (c == '(' || c == '[') {
      in_.advance();
      skip_space();
      const int group = alternation(depth + 1);
      if (!in_.take(c == '(' ? ")" : "]"))
        throw in_.error(c == '(' ? "expected ')'" : "expected ']'");
      if (c == '(') return group;
      return repeat(group, 0, 1);
    }
    if (is_name_start(c)) {
      GrammarExpr ref;
      ref.kind = GrammarExpr::Kind::kRule;
      ref.rule = out_.rule_named(name());
      if (in_.peek() == '{') throw in_.error("templates are not supported");
      return out_.add(std::move(ref));
    }
    throw in_.error(fmt::format("unexpected '{}'", c));
  }

  // "text", "text"i, or the range "a".."z".
  int string_or_range() {
    std::vector<uint32_t> codes = quoted();
    if (in_.take("..")) {
      const std::vector<uint32_t> high = quoted();
      if (codes.size() != 1 || high.size() != 1 || high[0] < codes[0])
        throw in_.error("a range runs between two single characters, low to high");
      RegexNode node;
      node.kind = RegexNode::Kind::kChars;
      node.chars = {{codes[0], high[0]}};
      return terminal(out_.terminals.add(std::move(node)));
    }
    if (in_.take("i")) return terminal(out_.terminals.add(either_case(codes)));
    return terminal(out_.terminals.add(code_point_sequence(out_.terminals, codes)));
  }

  std::vector<uint32_t> quoted() {
    if (!in_.take("\"")) throw in_.error("expected '\"'");
    std::vector<uint32_t> codes;
    while (!in_.take("\"")) {
      if (in_.done() || in_.peek() == '\n') throw in_.error("unterminated string");
      codes.push_back(in_.character());
    }
    return codes;
  }

  RegexNode either_case(const std::vector<uint32_t>& codes) {
    RegexNode sequence;
    sequence.kind = RegexNode::Kind::kConcat;
    for (uint32_t code : codes) {
      RegexNode one;
      one.kind = RegexNode::Kind::kChars;
      one.chars = {{code, code}};
      if (code < 128 && std::isalpha(static_cast<int>(code))) {
        const auto other = static_cast<uint32_t>(std::islower(static_cast<int>(code))
                                                     ? std::toupper(static_cast<int>(code))
                                                     : std::tolower(static_cast<int>(code)));
        one.chars = normalised_code_points({{code, code}, {other, other}});
      }
      sequence.children.push_back(out_.terminals.add(std::move(one)));
    }
    return sequence;
  }

  // /pattern/flags: the pattern must match the whole terminal.
  int regex() {
    in_.advance();  // '/'
    std::string pattern;
    while (!in_.take("/")) {
      if (in_.done() || in_.peek() == '\n') throw in_.error("unterminated regular expression");
      if (in_.peek() == '\\' && in_.peek(1) == '/') {
        in_.advance();
      } else if (in_.peek() == '\\') {
        pattern.push_back('\\');
        in_.advance();
        if (in_.done()) throw in_.error("unterminated regular expression");
      }
      pattern.push_back(in_.peek());
      in_.advance();
    }
    while (is_name_char(in_.peek())) {
      const char flag = in_.peek();
      if (flag != 'u')
        throw in_.error(fmt::format("regular expression flag '{}' is not supported", flag));
      in_.advance();
    }
    try {
      return terminal(graft(out_.terminals, RegexTree::parse(pattern)));
    } catch (const GrammarError& error) {
      throw in_.error(error.what());
    }
  }

  int terminal(int node) { return out_.add_terminal(node); }

  int repeat(int child, int min, int max) { return out_.add_repeat(child, min, max); }

  int postfix(int child) {
    skip_inline_space();
    if (in_.take("*")) return postfix(repeat(child, 0, -1));
    if (in_.take("+")) return postfix(repeat(child, 1, -1));
    if (in_.take("?")) return postfix(repeat(child, 0, 1));
    if (in_.take("~")) {
      skip_inline_space();
      const int min = count();
      int max = min;
      if (in_.take("..")) max = count();
      if (max < min) throw in_.error("a repeat's upper bound is below its lower bound");
      return postfix(repeat(child, min, max));
    }
    return child;
  }

  int count() {
    if (in_.peek() < '0' || in_.peek() > '9') throw in_.error("expected a repeat count");
    int value = 0;
    while (in_.peek() >= '0' && in_.peek() <= '9') {
      value = value * 10 + (in_.peek() - '0');
      if (value > GrammarSource::kMaxRepeat)
        throw in_.error(fmt::format("a repeat count above {}", GrammarSource::kMaxRepeat));
      in_.advance();
    }
    return value;
  }

  GrammarCursor in_;
  GrammarSource& out_;
};

// A literal, class or regex, or a use of a terminal.
bool is_token(const GrammarSource& source, int index) {
  const GrammarExpr& e = source.exprs[static_cast<size_t>(index)];
  return e.kind == GrammarExpr::Kind::kTerminal ||
         (e.kind == GrammarExpr::Kind::kRule &&
          is_terminal_name(source.rules[static_cast<size_t>(e.rule)].name));
}

int after_gap(GrammarSource& source, int gap, int token) {
  GrammarExpr spaced;
  spaced.kind = GrammarExpr::Kind::kSequence;
  spaced.children = {gap, token};
  return source.add(std::move(spaced));
}

// %ignore: before every terminal a rule (not a terminal's definition) uses, and at the end.
void weave_ignored(GrammarSource& source, const std::vector<int>& ignored) {
  if (ignored.empty()) return;
  GrammarExpr any;
  any.kind = GrammarExpr::Kind::kAlternation;
  any.children = ignored;
  GrammarExpr many;
  many.kind = GrammarExpr::Kind::kRepeat;
  many.children = {source.add(std::move(any))};
  many.max = -1;
  const int gap = source.add(std::move(many));
  const size_t exprs = source.exprs.size();
  std::vector<uint8_t> in_rule(exprs, 0);
  for (const GrammarSource::Rule& rule : source.rules)
    if (!is_terminal_name(rule.name) && rule.body >= 0) in_rule[static_cast<size_t>(rule.body)] = 1;
  // Expressions are added children first, so a parent comes after its children: walk down.
  for (size_t e = exprs; e-- > 0;) {
    if (!in_rule[e]) continue;
    std::vector<int> children = source.exprs[e].children;
    for (int& child : children) {
      if (!is_token(source, child)) {
        in_rule[static_cast<size_t>(child)] = 1;
        continue;
      }
      child = after_gap(source, gap, child);
    }
    source.exprs[e].children = std::move(children);
  }
  for (GrammarSource::Rule& rule : source.rules)
    if (!is_terminal_name(rule.name) && rule.body >= 0 && is_token(source, rule.body))
      rule.body = after_gap(source, gap, rule.body);
  const int start = source.rule_named("__start");
  GrammarExpr ref;
  ref.kind = GrammarExpr::Kind::kRule;
  ref.rule = source.start;
  GrammarExpr body;
  body.kind = GrammarExpr::Kind::kSequence;
  body.children = {source.add(std::move(ref)), gap};
  source.rules[static_cast<size_t>(start)].body = source.add(std::move(body));
  source.start = start;
}

}  // namespace

GrammarSource GrammarSource::parse_lark(std::string_view text) {
  check_grammar_size(text);
  GrammarSource source;
  std::vector<int> ignored;
  LarkParser(text, source).parse(ignored);
  source.start = source.rule_named("start");
  weave_ignored(source, ignored);
  return source;
}

}  // namespace deepinfer::structured
