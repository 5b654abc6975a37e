// Regex and choice constraints: the ByteDfa's state is all a matcher holds, so the set of
// tokens allowed in a state is worked out once (a walk of the sorted vocabulary) and every
// later step in that state only applies it.
#include <array>
#include <cstring>
#include <limits>
#include <map>

#include "structured/dfa_masks.h"
#include "structured/program_constraint.h"
#include "structured/regex.h"
#include "structured/structured.h"
#include "structured/token_walk.h"

namespace deepinfer::structured {
namespace {

struct RegexProgram {
  RegexProgram(const RegexTree& tree, std::shared_ptr<const TokenTable> tokens)
      : dfa(tree), table(std::move(tokens)), masks(dfa, *table, true) {}
  ByteDfa dfa;
  std::shared_ptr<const TokenTable> table;
  DfaMasks masks;
};

class RegexMatcher final : public Matcher {
 public:
  explicit RegexMatcher(std::shared_ptr<const RegexProgram> program)
      : program_(std::move(program)) {}

  std::unique_ptr<Matcher> clone() const override { return std::make_unique<RegexMatcher>(*this); }

  TokenMask allowed() const override {
    return {program_->masks.allowed(state_), program_->table->size()};
  }

  bool accept(int32_t token) override {
    const TokenTable& table = *program_->table;
    if (token < 0 || token >= table.size()) return false;
    if (table.is_end(token)) return complete();
    const std::string& bytes = table.bytes(token);
    if (bytes.empty()) return false;
    int state = state_;
    for (char c : bytes) {
      state = program_->dfa.next(state, static_cast<uint8_t>(c));
      if (state == ByteDfa::kDead) return false;
    }
    state_ = state;
    return true;
  }

  bool complete() const override { return program_->dfa.accepting(state_); }

 private:
  std::shared_ptr<const RegexProgram> program_;
  int state_ = ByteDfa::kStart;
};

using RegexConstraint = ProgramConstraint<RegexMatcher, RegexProgram>;

}  // namespace

std::shared_ptr<const Constraint> regex_constraint(std::shared_ptr<const TokenTable> table,
                                                   std::string_view pattern) {
  return std::make_shared<RegexConstraint>(
      std::make_shared<RegexProgram>(RegexTree::parse(pattern), std::move(table)));
}

std::shared_ptr<const Constraint> choice_constraint(std::shared_ptr<const TokenTable> table,
                                                    const std::vector<std::string>& choices) {
  return std::make_shared<RegexConstraint>(
      std::make_shared<RegexProgram>(RegexTree::choice(choices), std::move(table)));
}

}  // namespace deepinfer::structured
