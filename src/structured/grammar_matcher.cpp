// Grammar constraints: an Earley chart per completion. A mask first takes, from each terminal
// the last row is inside, the tokens that terminal reads whole (cached per automaton state: in
// free text or a long string that is nearly every token, and costs no parsing); the Earley
// walk then tries only the tokens left, each prefix shared with the token before fed once.
#include <algorithm>
#include <limits>
#include <set>

#include "structured/dfa_masks.h"
#include "structured/earley_chart.h"
#include "structured/grammar.h"
#include "structured/structured.h"
#include "structured/token_walk.h"

namespace deepinfer::structured {
namespace {

// Masks kept for all of a grammar's terminals together (19 KB each for a 151k vocabulary).
constexpr size_t kMaxTerminalMasks = 2048;

struct GrammarProgram {
  GrammarProgram(Cfg grammar, std::shared_ptr<const TokenTable> tokens)
      : cfg(std::move(grammar)), table(std::move(tokens)) {
    const size_t per_terminal =
        std::max<size_t>(8, kMaxTerminalMasks / std::max<size_t>(1, cfg.terminals.size()));
    for (const auto& dfa : cfg.terminals)
      terminal_masks.push_back(std::make_unique<DfaMaskCache>(*dfa, *table, false, per_terminal));
  }
  Cfg cfg;
  std::shared_ptr<const TokenTable> table;
  std::vector<std::unique_ptr<DfaMaskCache>> terminal_masks;
};

class GrammarMatcher final : public Matcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const GrammarProgram> program)
      : program_(std::move(program)), chart_(&program_->cfg) {}

  std::unique_ptr<Matcher> clone() const override {
    return std::make_unique<GrammarMatcher>(*this);
  }

  void mask_logits(float* logits, int32_t vocab_size) const override {
    const TokenTable& table = *program_->table;
    std::vector<uint64_t> allowed((static_cast<size_t>(table.size()) + 63) / 64, 0);
    allow_whole_terminal_tokens(allowed);
    allow_parsed_tokens(allowed);
    if (chart_.complete())
      for (int32_t id : table.end_tokens()) mark(allowed, id);
    apply_mask_bits(allowed, table.size(), logits, vocab_size);
  }

  bool accept(int32_t token) override {
    const TokenTable& table = *program_->table;
    if (token < 0 || token >= table.size()) return false;
    if (table.is_end(token)) return complete();
    const std::string& bytes = table.bytes(token);
    if (bytes.empty()) return false;
    const size_t rows = chart_.rows();
    for (char c : bytes) {
      if (!chart_.feed(static_cast<uint8_t>(c))) {
        chart_.pop_to(rows);
        return false;
      }
    }
    return true;
  }

  bool complete() const override { return chart_.complete(); }

 private:
  // Tokens a terminal the parse is inside (or before) reads whole: the parse goes on inside it.
  void allow_whole_terminal_tokens(std::vector<uint64_t>& allowed) const {
    std::set<std::pair<int32_t, int32_t>> seen;
    chart_.each_scanning([&](int32_t terminal, int32_t state) {
      if (!seen.emplace(terminal, state).second) return;
      const auto mask = program_->terminal_masks[static_cast<size_t>(terminal)]->allowed(state);
      for (size_t word = 0; word < allowed.size(); ++word) allowed[word] |= (*mask)[word];
    });
  }

  // The rest through the chart. `held` rows above `base` hold the first bytes of the last
  // token parsed; `shared_since` is the prefix every token since then shares with it (the
  // least of their neighbours' shared prefixes), and `dead` the length of its first prefix no
  // parse reads.
  void allow_parsed_tokens(std::vector<uint64_t>& allowed) const {
    const TokenTable& table = *program_->table;
    constexpr size_t kNone = std::numeric_limits<size_t>::max();
    const size_t base = chart_.rows();
    size_t held = 0, shared_since = kNone, dead = kNone;
    for (const auto& [id, shared] : table.sorted()) {
      shared_since = std::min<size_t>(shared_since, shared);
      if (dead != kNone && shared_since >= dead) continue;
      if (allowed[static_cast<size_t>(id) / 64] >> (id % 64) & 1) continue;
      const std::string& bytes = table.bytes(id);
      if (bytes.empty()) continue;
      size_t depth = std::min(held, shared_since);
      chart_.pop_to(base + depth);
      while (depth < bytes.size() && chart_.feed(static_cast<uint8_t>(bytes[depth]))) ++depth;
      held = depth;
      shared_since = kNone;
      dead = depth < bytes.size() ? depth + 1 : kNone;
      if (depth == bytes.size()) mark(allowed, id);
    }
    chart_.pop_to(base);
  }

  std::shared_ptr<const GrammarProgram> program_;
  // The mask's walk pushes rows and pops them again: the chart it leaves is the one it found.
  mutable EarleyChart chart_;
};

class GrammarConstraint final : public Constraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<const GrammarProgram> program)
      : program_(std::move(program)) {}
  std::unique_ptr<Matcher> start() const override {
    return std::make_unique<GrammarMatcher>(program_);
  }

 private:
  std::shared_ptr<const GrammarProgram> program_;
};

}  // namespace

std::shared_ptr<const Constraint> grammar_constraint(std::shared_ptr<const TokenTable> table,
                                                     std::string_view grammar) {
  return std::make_shared<GrammarConstraint>(
      std::make_shared<GrammarProgram>(Cfg::lower(parse_grammar(grammar)), std::move(table)));
}

}  // namespace deepinfer::structured
