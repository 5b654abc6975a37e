// Chat template parsing: the source cut into text and tags (with Jinja's whitespace rules as
// transformers configures them: trim_blocks and lstrip_blocks on), then statements and
// expressions by recursive descent.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "chat/ast.h"
#include "core/error.h"

namespace deepinfer::chat {
namespace {

// Bounds that keep parsing and rendering within a thread's stack whatever the template: both
// recurse once per level of nesting, and freeing a parsed expression once per node depth.
// The token bound also bounds the chains that recurse without a bracket ("not not ...",
// "- - ..."), and the depth check after parsing bounds what rendering recurses through.
constexpr size_t kMaxTagTokens = 4096;    // tokens in one {{ }} or {% %}
constexpr int kMaxBracketNesting = 64;    // (), [], {}, calls and conditionals inside each other
constexpr int kMaxBlockNesting = 64;      // {% if %}, {% for %}, ... inside each other
constexpr int kMaxExpressionDepth = 256;  // operator and filter chains, after parsing

struct Segment {
  enum class Kind { kText, kOutput, kStatement } kind;
  std::string text;
  int line;
};

bool is_blank(char ch) {
  return ch == ' ' || ch == '\t';
}

// Splits source into text, {{ }} and {% %} (comments dropped), applying '-' trimming,
// trim_blocks and lstrip_blocks.
std::vector<Segment> segment(const std::string& source) {
  std::vector<Segment> segments;
  size_t at = 0;
  int line = 1;
  bool strip_next = false;    // the previous tag ended with '-'
  bool trim_newline = false;  // the previous tag was a block or comment (trim_blocks)
  auto count_lines = [&](size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) line += source[i] == '\n';
  };
  while (at <= source.size()) {
    size_t open = source.find('{', at);
    while (open != std::string::npos && open + 1 < source.size() && source[open + 1] != '{' &&
           source[open + 1] != '%' && source[open + 1] != '#') {
      open = source.find('{', open + 1);
    }
    if (open + 1 >= source.size()) open = std::string::npos;
    std::string text = source.substr(at, open == std::string::npos ? std::string::npos : open - at);
    char kind = open == std::string::npos ? 0 : source[open + 1];
    bool strip_before = kind && open + 2 < source.size() && source[open + 2] == '-';
    bool keep_blank = kind && open + 2 < source.size() && source[open + 2] == '+';
    if (strip_next) {
      size_t first = text.find_first_not_of(" \t\r\n");
      text = first == std::string::npos ? "" : text.substr(first);
    } else if (trim_newline) {
      if (text.rfind("\r\n", 0) == 0) {
        text.erase(0, 2);
      } else if (!text.empty() && text[0] == '\n') {
        text.erase(0, 1);
      }
    }
    if (strip_before) {
      size_t last = text.find_last_not_of(" \t\r\n");
      text = last == std::string::npos ? "" : text.substr(0, last + 1);
    } else if ((kind == '%' || kind == '#') && !keep_blank) {
      // lstrip_blocks: blanks between a line start (in the source) and a block tag go.
      size_t blank_start = open;
      while (blank_start > at && is_blank(source[blank_start - 1])) --blank_start;
      bool line_start = blank_start == 0 || source[blank_start - 1] == '\n';
      if (line_start) text.erase(text.size() - std::min(text.size(), open - blank_start));
    }
    if (!text.empty()) segments.push_back({Segment::Kind::kText, text, line});
    count_lines(at, open == std::string::npos ? source.size() : open);
    if (open == std::string::npos) break;
    const char* closer = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t close = source.find(closer, open + 2);
    if (close == std::string::npos) fail("chat template line {}: unclosed tag", line);
    size_t inner_begin = open + 2 + (strip_before || keep_blank ? 1 : 0);
    bool strip_after = close > inner_begin && source[close - 1] == '-';
    size_t inner_end = strip_after ? close - 1 : close;
    std::string inner = source.substr(inner_begin, inner_end - inner_begin);
    if (kind == '{') segments.push_back({Segment::Kind::kOutput, inner, line});
    if (kind == '%') segments.push_back({Segment::Kind::kStatement, inner, line});
    count_lines(open, close + 2);
    strip_next = strip_after;
    trim_newline = kind != '{';
    at = close + 2;
  }
  return segments;
}

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOperator, kEnd } kind;
  std::string text;
  Value value;
};

// The quoted literal starting at code[i] (the quote), with Python's escapes; i moves past it.
std::string string_literal(const std::string& code, size_t& i, int line) {
  char quote = code[i++];
  std::string text;
  while (i < code.size() && code[i] != quote) {
    if (code[i] == '\\' && i + 1 < code.size()) {
      char escaped = code[++i];
      switch (escaped) {
        case 'n':
          text += '\n';
          break;
        case 't':
          text += '\t';
          break;
        case 'r':
          text += '\r';
          break;
        case '\\':
        case '\'':
        case '"':
          text += escaped;
          break;
        default:
          text += '\\';
          text += escaped;
      }
      ++i;
    } else {
      text += code[i++];
    }
  }
  if (i >= code.size()) fail("chat template line {}: unterminated string", line);
  ++i;
  return text;
}

std::vector<Token> lex(const std::string& code, int line) {
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < code.size()) {
    char ch = code[i];
    if (std::isspace(static_cast<unsigned char>(ch))) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(ch)) || ch == '_') {
      size_t start = i;
      while (i < code.size() &&
             (std::isalnum(static_cast<unsigned char>(code[i])) || code[i] == '_'))
        ++i;
      tokens.push_back({Token::Kind::kName, code.substr(start, i - start), Value()});
    } else if (std::isdigit(static_cast<unsigned char>(ch))) {
      size_t start = i;
      while (i < code.size() && std::isdigit(static_cast<unsigned char>(code[i]))) ++i;
      bool is_float = i + 1 < code.size() && code[i] == '.' &&
                      std::isdigit(static_cast<unsigned char>(code[i + 1]));
      if (is_float) {
        ++i;
        while (i < code.size() && std::isdigit(static_cast<unsigned char>(code[i]))) ++i;
        // strtod: a literal too large for a double is inf, as in Python, not an exception.
        std::string digits = code.substr(start, i - start);
        tokens.push_back({Token::Kind::kFloat, "", Value(std::strtod(digits.c_str(), nullptr))});
      } else {
        int64_t number = 0;
        auto [end, error] = std::from_chars(code.data() + start, code.data() + i, number);
        if (error != std::errc() || end != code.data() + i)
          fail("chat template line {}: integer literal {} does not fit in 64 bits", line,
               code.substr(start, std::min<size_t>(i - start, 40)));
        tokens.push_back({Token::Kind::kInt, "", Value(number)});
      }
    } else if (ch == '\'' || ch == '"') {
      std::string text = string_literal(code, i, line);
      tokens.push_back({Token::Kind::kString, "", Value(text)});
    } else {
      static const char* kOperators[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                         "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                         "]",  "{",  "}",  ",",  ".",  ":",  "|"};
      bool matched = false;
      for (const char* op : kOperators) {
        size_t length = std::char_traits<char>::length(op);
        if (code.compare(i, length, op) == 0) {
          tokens.push_back({Token::Kind::kOperator, op, Value()});
          i += length;
          matched = true;
          break;
        }
      }
      if (!matched) fail("chat template line {}: unexpected character '{}'", line, ch);
    }
  }
  if (tokens.size() > kMaxTagTokens)
    fail("chat template line {}: a tag of more than {} tokens", line, kMaxTagTokens);
  tokens.push_back({Token::Kind::kEnd, "", Value()});
  return tokens;
}

// Counts a level of nesting while it is open; too many is an Error naming the line.
class NestingLevel {
 public:
  NestingLevel(int& depth, int limit, int line) : depth_(depth) {
    if (++depth_ > limit) {
      --depth_;
      fail("chat template line {}: nested more than {} levels deep", line, limit);
    }
  }
  ~NestingLevel() { --depth_; }
  NestingLevel(const NestingLevel&) = delete;
  NestingLevel& operator=(const NestingLevel&) = delete;

 private:
  int& depth_;
};

// The deepest chain of sub-expressions under `root`, found without recursion (the tree is
// not yet known to be shallow).
int expression_depth(const Expr& root) {
  int deepest = 0;
  std::vector<std::pair<const Expr*, int>> pending = {{&root, 1}};
  while (!pending.empty()) {
    auto [expr, depth] = pending.back();
    pending.pop_back();
    deepest = std::max(deepest, depth);
    for (const ExprPtr& child : expr->children)
      if (child) pending.push_back({child.get(), depth + 1});
    for (const auto& keyword : expr->keywords)
      if (keyword.second) pending.push_back({keyword.second.get(), depth + 1});
  }
  return deepest;
}

// Every expression in `body` within kMaxExpressionDepth (blocks are already bounded).
void check_expression_depths(const Body& body) {
  auto check = [](const ExprPtr& expr, int line) {
    if (expr && expression_depth(*expr) > kMaxExpressionDepth)
      fail("chat template line {}: an expression nested more than {} levels deep", line,
           kMaxExpressionDepth);
  };
  for (const auto& node : body) {
    check(node->expr, node->line);
    check(node->filter, node->line);
    for (const ExprPtr& condition : node->conditions) check(condition, node->line);
    for (const auto& parameter : node->parameters) check(parameter.second, node->line);
    for (const Body& branch : node->branches) check_expression_depths(branch);
  }
}

class ExpressionParser {
 public:
  ExpressionParser(std::vector<Token> tokens, int line) : tokens_(std::move(tokens)), line_(line) {}

  bool at_end() const { return peek().kind == Token::Kind::kEnd; }
  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(position_ + ahead, tokens_.size() - 1)];
  }
  bool is_operator(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::kOperator && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::kName && peek(ahead).text == name;
  }
  bool accept_operator(const char* op) {
    if (!is_operator(op)) return false;
    ++position_;
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    ++position_;
    return true;
  }
  void expect_operator(const char* op) {
    if (!accept_operator(op)) error(fmt::format("expected '{}'", op));
  }
  std::string expect_name() {
    if (peek().kind != Token::Kind::kName) error("expected a name");
    return tokens_[position_++].text;
  }
  void expect_end() {
    if (!at_end()) error(fmt::format("unexpected '{}'", describe(peek())));
  }
  [[noreturn]] void error(const std::string& message) const {
    fail("chat template line {}: {}", line_, message);
  }

  ExprPtr expression() {
    NestingLevel level(nesting_, kMaxBracketNesting, line_);
    ExprPtr value = or_expression();
    if (accept_name("if")) {
      auto node = make(Expr::Type::kConditional);
      node->children.push_back(or_expression());
      node->children.push_back(std::move(value));
      node->children.push_back(accept_name("else") ? expression() : literal(Value()));
      return node;
    }
    return value;
  }

  // Comma-separated expressions without brackets: a tuple when there is more than one.
  ExprPtr tuple_or_expression() {
    ExprPtr first = expression();
    if (!is_operator(",")) return first;
    auto tuple = make(Expr::Type::kTuple);
    tuple->children.push_back(std::move(first));
    while (accept_operator(",")) {
      if (at_end()) break;
      tuple->children.push_back(expression());
    }
    return tuple;
  }

 private:
  static std::string describe(const Token& token) {
    if (token.kind == Token::Kind::kString) return "string";
    if (token.kind == Token::Kind::kInt || token.kind == Token::Kind::kFloat) return "number";
    return token.text;
  }
  ExprPtr make(Expr::Type type) {
    auto node = std::make_unique<Expr>();
    node->type = type;
    node->line = line_;
    return node;
  }
  ExprPtr literal(Value value) {
    auto node = make(Expr::Type::kLiteral);
    node->value = std::move(value);
    return node;
  }
  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right) {
    auto node = make(Expr::Type::kBinary);
    node->name = op;
    node->children.push_back(std::move(left));
    node->children.push_back(std::move(right));
    return node;
  }

  ExprPtr or_expression() {
    ExprPtr left = and_expression();
    while (accept_name("or")) left = binary("or", std::move(left), and_expression());
    return left;
  }
  ExprPtr and_expression() {
    ExprPtr left = not_expression();
    while (accept_name("and")) left = binary("and", std::move(left), not_expression());
    return left;
  }
  ExprPtr not_expression() {
    if (accept_name("not")) {
      auto node = make(Expr::Type::kNot);
      node->children.push_back(not_expression());
      return node;
    }
    return comparison();
  }
  ExprPtr comparison() {
    ExprPtr left = concatenation();
    while (true) {
      static const char* kComparisons[] = {"==", "!=", "<=", ">=", "<", ">"};
      bool matched = false;
      for (const char* op : kComparisons) {
        if (accept_operator(op)) {
          left = binary(op, std::move(left), concatenation());
          matched = true;
          break;
        }
      }
      if (matched) continue;
      if (accept_name("in")) {
        left = binary("in", std::move(left), concatenation());
      } else if (is_name("not") && is_name("in", 1)) {
        position_ += 2;
        left = binary("not in", std::move(left), concatenation());
      } else if (accept_name("is")) {
        auto test = make(Expr::Type::kTest);
        test->negated = accept_name("not");
        test->name = expect_name();
        test->children.push_back(std::move(left));
        if (accept_operator("(")) {
          arguments(*test);
        } else if (peek().kind == Token::Kind::kString || peek().kind == Token::Kind::kInt ||
                   peek().kind == Token::Kind::kFloat) {
          test->children.push_back(literal(tokens_[position_++].value));
        }
        left = std::move(test);
      } else {
        return left;
      }
    }
  }
  ExprPtr concatenation() {
    ExprPtr left = additive();
    while (accept_operator("~")) left = binary("~", std::move(left), additive());
    return left;
  }
  ExprPtr additive() {
    ExprPtr left = multiplicative();
    while (is_operator("+") || is_operator("-")) {
      std::string op = tokens_[position_++].text;
      left = binary(op, std::move(left), multiplicative());
    }
    return left;
  }
  ExprPtr multiplicative() {
    ExprPtr left = unary();
    while (is_operator("*") || is_operator("/") || is_operator("//") || is_operator("%")) {
      std::string op = tokens_[position_++].text;
      left = binary(op, std::move(left), unary());
    }
    return left;
  }
  ExprPtr unary() {
    if (accept_operator("-")) {
      auto node = make(Expr::Type::kNegate);
      node->children.push_back(unary());
      return node;
    }
    if (accept_operator("+")) return unary();
    return postfix(primary());
  }
  ExprPtr postfix(ExprPtr value) {
    while (true) {
      if (accept_operator(".")) {
        auto node = make(Expr::Type::kAttribute);
        node->name = expect_name();
        node->children.push_back(std::move(value));
        value = std::move(node);
      } else if (accept_operator("[")) {
        value = subscript(std::move(value));
      } else if (accept_operator("(")) {
        auto node = make(Expr::Type::kCall);
        node->children.push_back(std::move(value));
        arguments(*node);
        value = std::move(node);
      } else if (accept_operator("|")) {
        auto node = make(Expr::Type::kFilter);
        node->name = expect_name();
        node->children.push_back(std::move(value));
        if (accept_operator("(")) arguments(*node);
        value = std::move(node);
      } else {
        return value;
      }
    }
  }
  ExprPtr subscript(ExprPtr value) {
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    while (!accept_operator("]")) {
      if (accept_operator(":")) {
        slice = true;
        if (++part > 2) error("too many ':' in a slice");
        continue;
      }
      if (parts[part]) error("expected ']'");
      parts[part] = expression();
    }
    if (!slice) {
      if (!parts[0]) error("empty subscript");
      auto node = make(Expr::Type::kItem);
      node->children.push_back(std::move(value));
      node->children.push_back(std::move(parts[0]));
      return node;
    }
    auto node = make(Expr::Type::kSlice);
    node->children.push_back(std::move(value));
    for (ExprPtr& bound : parts) node->children.push_back(std::move(bound));
    return node;
  }
  // After '(' : positional and keyword arguments up to ')'.
  void arguments(Expr& call) {
    while (!accept_operator(")")) {
      if (peek().kind == Token::Kind::kName && is_operator("=", 1)) {
        std::string name = expect_name();
        expect_operator("=");
        call.keywords.emplace_back(name, expression());
      } else {
        call.children.push_back(expression());
      }
      if (!is_operator(")")) expect_operator(",");
    }
  }
  ExprPtr primary() {
    const Token& token = peek();
    switch (token.kind) {
      case Token::Kind::kString: {
        ++position_;
        std::string text = token.value.as_string();
        // Adjacent string literals concatenate, as in Python.
        while (peek().kind == Token::Kind::kString) text += tokens_[position_++].value.as_string();
        return literal(Value(text));
      }
      case Token::Kind::kInt:
      case Token::Kind::kFloat:
        ++position_;
        return literal(token.value);
      case Token::Kind::kName: {
        ++position_;
        if (token.text == "true" || token.text == "True") return literal(Value(true));
        if (token.text == "false" || token.text == "False") return literal(Value(false));
        if (token.text == "none" || token.text == "None") return literal(Value::none());
        auto node = make(Expr::Type::kName);
        node->name = token.text;
        return node;
      }
      case Token::Kind::kOperator:
        break;
      case Token::Kind::kEnd:
        error("unexpected end of expression");
    }
    if (accept_operator("(")) {
      if (accept_operator(")")) return make(Expr::Type::kTuple);
      ExprPtr inner = tuple_or_expression();
      expect_operator(")");
      return inner;
    }
    if (accept_operator("[")) {
      auto node = make(Expr::Type::kList);
      while (!accept_operator("]")) {
        node->children.push_back(expression());
        if (!is_operator("]")) expect_operator(",");
      }
      return node;
    }
    if (accept_operator("{")) {
      auto node = make(Expr::Type::kDict);
      while (!accept_operator("}")) {
        node->children.push_back(expression());
        expect_operator(":");
        node->children.push_back(expression());
        if (!is_operator("}")) expect_operator(",");
      }
      return node;
    }
    error(fmt::format("unexpected '{}'", describe(token)));
  }

  std::vector<Token> tokens_;
  size_t position_ = 0;
  int line_;
  int nesting_ = 0;
};

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  Body parse_all() {
    Body body = parse_body({});
    if (index_ < segments_.size())
      fail("chat template line {}: unexpected '{}'", segments_[index_].line, keyword_of(index_));
    check_expression_depths(body);
    return body;
  }

 private:
  std::string keyword_of(size_t index) const {
    ExpressionParser parser(lex(segments_[index].text, segments_[index].line),
                            segments_[index].line);
    return parser.peek().kind == Token::Kind::kName ? parser.peek().text : "";
  }

  // Parses nodes until a statement whose keyword is in `stops` (left unconsumed).
  Body parse_body(const std::vector<std::string>& stops) {
    NestingLevel level(blocks_, kMaxBlockNesting,
                       index_ < segments_.size() ? segments_[index_].line : 0);
    Body body;
    while (index_ < segments_.size()) {
      const Segment& segment = segments_[index_];
      if (segment.kind == Segment::Kind::kText) {
        auto node = node_of(Node::Type::kText, segment.line);
        node->text = segment.text;
        body.push_back(std::move(node));
        ++index_;
        continue;
      }
      if (segment.kind == Segment::Kind::kOutput) {
        ExpressionParser parser(lex(segment.text, segment.line), segment.line);
        auto node = node_of(Node::Type::kOutput, segment.line);
        node->expr = parser.expression();
        parser.expect_end();
        body.push_back(std::move(node));
        ++index_;
        continue;
      }
      std::string keyword = keyword_of(index_);
      if (std::find(stops.begin(), stops.end(), keyword) != stops.end()) return body;
      body.push_back(statement(keyword));
    }
    if (!stops.empty()) fail("chat template: missing '{{% {} %}}' at the end", stops.back());
    return body;
  }

  std::unique_ptr<Node> node_of(Node::Type type, int line) {
    auto node = std::make_unique<Node>();
    node->type = type;
    node->line = line;
    return node;
  }

  // The current statement's parser, positioned after its keyword.
  ExpressionParser open_statement() {
    const Segment& segment = segments_[index_++];
    ExpressionParser parser(lex(segment.text, segment.line), segment.line);
    parser.expect_name();
    return parser;
  }

  void close(const char* keyword) {
    if (index_ >= segments_.size() || keyword_of(index_) != keyword)
      fail("chat template: expected '{{% {} %}}'", keyword);
    open_statement().expect_end();
  }

  std::unique_ptr<Node> statement(const std::string& keyword) {
    int line = segments_[index_].line;
    if (keyword == "if") return if_statement(line);
    if (keyword == "for") return for_statement(line);
    if (keyword == "set") return set_statement(line);
    if (keyword == "macro") return macro_statement(line);
    if (keyword == "call") return call_statement(line);
    if (keyword == "generation") {
      // transformers' AssistantTracker marks assistant text for masks; rendering is unchanged.
      open_statement().expect_end();
      auto node = node_of(Node::Type::kFilterBlock, line);
      node->branches.push_back(parse_body({"endgeneration"}));
      close("endgeneration");
      return node;
    }
    if (keyword == "filter") {
      ExpressionParser parser = open_statement();
      auto node = node_of(Node::Type::kFilterBlock, line);
      node->filter = filter_chain(parser);
      node->branches.push_back(parse_body({"endfilter"}));
      close("endfilter");
      return node;
    }
    if (keyword == "break" || keyword == "continue") {
      open_statement().expect_end();
      return node_of(keyword == "break" ? Node::Type::kBreak : Node::Type::kContinue, line);
    }
    fail("chat template line {}: unsupported statement '{}'", line, keyword);
  }

  // "upper | replace('a', 'b')" as a filter chain applied to a placeholder.
  ExprPtr filter_chain(ExpressionParser& parser) {
    auto placeholder = std::make_unique<Expr>();
    placeholder->type = Expr::Type::kName;
    placeholder->name = kBlockBody;
    ExprPtr chain = std::move(placeholder);
    do {
      auto node = std::make_unique<Expr>();
      node->type = Expr::Type::kFilter;
      node->name = parser.expect_name();
      node->children.push_back(std::move(chain));
      if (parser.accept_operator("(")) {
        // Reuse the argument syntax by parsing a call and moving its arguments.
        while (!parser.accept_operator(")")) {
          node->children.push_back(parser.expression());
          if (!parser.is_operator(")")) parser.expect_operator(",");
        }
      }
      chain = std::move(node);
    } while (parser.accept_operator("|"));
    parser.expect_end();
    return chain;
  }

  std::unique_ptr<Node> if_statement(int line) {
    auto node = node_of(Node::Type::kIf, line);
    ExpressionParser parser = open_statement();
    node->conditions.push_back(parser.expression());
    parser.expect_end();
    node->branches.push_back(parse_body({"elif", "else", "endif"}));
    while (true) {
      std::string keyword = keyword_of(index_);
      if (keyword == "elif") {
        ExpressionParser branch = open_statement();
        node->conditions.push_back(branch.expression());
        branch.expect_end();
        node->branches.push_back(parse_body({"elif", "else", "endif"}));
      } else if (keyword == "else") {
        open_statement().expect_end();
        node->branches.push_back(parse_body({"endif"}));
      } else {
        close("endif");
        return node;
      }
    }
  }

  std::unique_ptr<Node> for_statement(int line) {
    auto node = node_of(Node::Type::kFor, line);
    ExpressionParser parser = open_statement();
    do {
      node->targets.push_back(parser.expect_name());
    } while (parser.accept_operator(","));
    if (!parser.accept_name("in")) parser.error("expected 'in'");
    node->expr = parser.expression();
    if (parser.accept_name("if")) node->conditions.push_back(parser.expression());
    parser.accept_name("recursive");
    parser.expect_end();
    node->branches.push_back(parse_body({"else", "endfor"}));
    if (keyword_of(index_) == "else") {
      open_statement().expect_end();
      node->branches.push_back(parse_body({"endfor"}));
    }
    close("endfor");
    return node;
  }

  std::unique_ptr<Node> set_statement(int line) {
    ExpressionParser parser = open_statement();
    std::vector<std::string> targets;
    std::string attribute;
    do {
      targets.push_back(parser.expect_name());
    } while (parser.accept_operator(","));
    if (targets.size() == 1 && parser.accept_operator(".")) attribute = parser.expect_name();
    if (parser.accept_operator("=")) {
      auto node = node_of(Node::Type::kSet, line);
      node->targets = targets;
      node->attribute = attribute;
      node->expr = parser.tuple_or_expression();
      parser.expect_end();
      return node;
    }
    auto node = node_of(Node::Type::kSetBlock, line);
    node->targets = targets;
    if (parser.accept_operator("|")) {
      node->filter = filter_chain(parser);
    } else {
      parser.expect_end();
    }
    node->branches.push_back(parse_body({"endset"}));
    close("endset");
    return node;
  }

  // After '(': "name" or "name=default" entries up to ')', for macros and call blocks.
  void parameters(ExpressionParser& parser, Node& node) {
    while (!parser.accept_operator(")")) {
      std::string name = parser.expect_name();
      ExprPtr fallback;
      if (parser.accept_operator("=")) fallback = parser.expression();
      node.parameters.emplace_back(name, std::move(fallback));
      if (!parser.is_operator(")")) parser.expect_operator(",");
    }
  }

  // {% call(params) macro(args) %}body{% endcall %}: the macro's caller() renders the body.
  std::unique_ptr<Node> call_statement(int line) {
    auto node = node_of(Node::Type::kCallBlock, line);
    ExpressionParser parser = open_statement();
    if (parser.accept_operator("(")) parameters(parser, *node);
    node->expr = parser.expression();
    parser.expect_end();
    node->branches.push_back(parse_body({"endcall"}));
    close("endcall");
    return node;
  }

  std::unique_ptr<Node> macro_statement(int line) {
    auto node = node_of(Node::Type::kMacro, line);
    ExpressionParser parser = open_statement();
    node->targets.push_back(parser.expect_name());
    parser.expect_operator("(");
    parameters(parser, *node);
    parser.expect_end();
    node->branches.push_back(parse_body({"endmacro"}));
    close("endmacro");
    return node;
  }

  std::vector<Segment> segments_;
  size_t index_ = 0;
  int blocks_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) {
  return TemplateParser(segment(source)).parse_all();
}

}  // namespace deepinfer::chat
