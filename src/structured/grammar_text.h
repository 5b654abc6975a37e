// What the GBNF and Lark parsers share: a cursor over the grammar's text that reads escaped
// characters and repeat bounds and names the line of an error, and the terminal pieces both
// build.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "structured/grammar.h"

namespace deepinfer::structured {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

class GrammarCursor {
 public:
  GrammarCursor(std::string_view text, std::string_view syntax) : text_(text), syntax_(syntax) {}
  std::string_view text() const { return text_; }
  size_t at() const { return at_; }
  bool done() const { return at_ >= text_.size(); }
  char peek(size_t ahead = 0) const {
    return at_ + ahead < text_.size() ? text_[at_ + ahead] : '\0';
  }
  void advance() {
    if (at_ < text_.size()) ++at_;
  }
  // Steps over `word` when the text continues with it.
  bool take(std::string_view word);
  // One character of a literal or class: an escape (\n, \t, \r, \xHH, \uHHHH, \UHHHHHHHH, or a
  // backslash before punctuation) or one UTF-8 character.
  uint32_t character();
  // {m}, {m,} or {m,n}, each at most `limit`.
  void repeat_bounds(int& min, int& max, int limit);
  GrammarError error(std::string_view what) const;

 private:
  uint32_t hex(int digits);
  std::string_view text_, syntax_;
  size_t at_ = 0;
};

// `sequence` ('|' `sequence`)*: one sequence, or their alternation. `skip_space` runs after
// each '|'.
template <typename Sequence, typename Space>
int parse_alternatives(GrammarCursor& in, GrammarSource& out, int depth, Sequence sequence,
                       Space skip_space) {
  if (depth > GrammarSource::kMaxNesting) throw in.error("groups nest too deeply");
  GrammarExpr alternatives;
  alternatives.kind = GrammarExpr::Kind::kAlternation;
  alternatives.children.push_back(sequence(depth));
  while (in.take("|")) {
    skip_space();
    alternatives.children.push_back(sequence(depth));
  }
  if (alternatives.children.size() == 1) return alternatives.children[0];
  return out.add(std::move(alternatives));
}

// Throws GrammarError for a grammar longer than GrammarSource::kMaxGrammarBytes.
void check_grammar_size(std::string_view text);

// The characters `codes`, one after another.
RegexNode code_point_sequence(RegexTree& tree, const std::vector<uint32_t>& codes);
// Any one character.
RegexNode any_char();
// Copies `from`'s nodes into `into`; returns the index its root has there.
int graft(RegexTree& into, const RegexTree& from);

}  // namespace deepinfer::structured
