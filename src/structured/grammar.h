// Context-free grammars for constrained output: GBNF (llama.cpp's syntax) and Lark-style EBNF
// are parsed into one tree of expressions, then lowered to a grammar whose terminals are byte
// automata (every part of a rule that refers to no recursive rule becomes one ByteDfa), which
// the Earley matcher runs byte by byte.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "structured/regex.h"

namespace deepinfer::structured {

// One expression of a grammar's rules, as parsed. Terminal pieces (literals, character
// classes, regular expressions) are nodes of GrammarSource::terminals.
struct GrammarExpr {
  enum class Kind : uint8_t { kTerminal, kRule, kSequence, kAlternation, kRepeat };
  Kind kind = Kind::kSequence;
  int terminal = -1;          // kTerminal: node of GrammarSource::terminals
  int rule = -1;              // kRule: index into GrammarSource::rules
  std::vector<int> children;  // kSequence, kAlternation; kRepeat: its one child
  int min = 0, max = 0;       // kRepeat; max < 0: unbounded
};

struct GrammarSource {
  struct Rule {
    std::string name;
    int body = -1;  // -1: referred to but never defined
  };
  RegexTree terminals;
  std::vector<GrammarExpr> exprs;
  std::vector<Rule> rules;
  std::map<std::string, int, std::less<>> rule_index;
  int start = -1;

  // Limits that keep a hostile grammar from costing the server more than a small request.
  static constexpr size_t kMaxGrammarBytes = 256 * 1024;
  static constexpr size_t kMaxExprs = 100000;
  static constexpr int kMaxNesting = 200;
  static constexpr int kMaxRepeat = 1000;

  // llama.cpp's GBNF: `name ::= ...` rules, "literals", [classes], '.', groups, | * + ? and
  // {m,n}, '#' comments; the start rule is `root`. Throws GrammarError naming the construct
  // and its line.
  static GrammarSource parse_gbnf(std::string_view text);
  // Lark's EBNF: `rule: ...` and `TERMINAL: ...` definitions, "strings"i, /regex/flags,
  // "a".."z", [optional], ~ repeats, %import common.NAME and %ignore; the start rule is
  // `start`.
  static GrammarSource parse_lark(std::string_view text);

  int add(GrammarExpr expr);
  int add_terminal(int node);                   // an expression of terminals' node `node`
  int add_repeat(int child, int min, int max);  // `child` min to max times (max < 0: any)
  int rule_named(std::string_view name);        // the rule's index, added undefined on first use
};

// GBNF when the text defines `root ::=`, else Lark.
GrammarSource parse_grammar(std::string_view text);

// The grammar the matcher runs: productions over rule and terminal symbols.
struct Cfg {
  struct Symbol {
    int32_t id = 0;  // a rule, or a terminal when `terminal`
    bool terminal = false;
    bool operator==(const Symbol&) const = default;
  };
  struct Production {
    int rule = 0;
    std::vector<Symbol> symbols;
  };
  std::vector<Production> productions;
  std::vector<std::vector<int32_t>> rule_productions;
  std::vector<uint8_t> rule_nullable;
  std::vector<std::unique_ptr<ByteDfa>> terminals;
  std::vector<uint8_t> terminal_nullable;
  int32_t start_production = 0;  // a production of one symbol: the start rule

  static constexpr size_t kMaxProductions = 50000;
  static constexpr size_t kMaxTerminals = 4000;

  // Throws GrammarError for a rule referred to but never defined, or past the limits.
  static Cfg lower(const GrammarSource& source);
};

}  // namespace deepinfer::structured
