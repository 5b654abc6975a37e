// Grammar constraints: an Earley chart per completion. A mask first takes, from each terminal
// the last row is inside, the tokens that terminal reads whole (cached per automaton state: in
// free text or a long string that is nearly every token, and costs no parsing); the Earley
// walk then tries only the tokens left whose first byte can come next, each prefix shared with
// the token before fed once. Whole masks are kept by the chart's key, so a state met again
// (later in the output, or in another request) costs only applying them.
#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <set>

#include "structured/dfa_masks.h"
#include "structured/earley_chart.h"
#include "structured/grammar.h"
#include "structured/kept_masks.h"
#include "structured/program_constraint.h"
#include "structured/structured.h"
#include "structured/token_walk.h"

namespace deepinfer::structured {
namespace {

// Masks kept of whole chart states (19 KB each for a 151k vocabulary).
constexpr size_t kMaxStateMasks = 512;

using Mask = std::shared_ptr<const std::vector<uint64_t>>;
using ChartKey = std::pair<uint64_t, uint64_t>;

struct GrammarProgram {
  GrammarProgram(Cfg grammar, std::shared_ptr<const TokenTable> tokens)
      : cfg(std::move(grammar)), table(std::move(tokens)) {
    for (const auto& dfa : cfg.terminals)
      terminal_masks.push_back(std::make_unique<DfaMasks>(*dfa, *table, false));
    rank_of.assign(static_cast<size_t>(table->size()), -1);
    const auto& sorted = table->sorted();
    for (size_t rank = 0; rank < sorted.size(); ++rank) {
      rank_of[static_cast<size_t>(sorted[rank].first)] = static_cast<int32_t>(rank);
      const auto first = static_cast<uint8_t>(table->bytes(sorted[rank].first)[0]);
      if (first_byte_ranks[first].second == 0) first_byte_ranks[first].first = rank;
      first_byte_ranks[first].second = rank + 1;
    }
  }

  Cfg cfg;
  std::shared_ptr<const TokenTable> table;
  std::vector<std::unique_ptr<DfaMasks>> terminal_masks;
  std::vector<int32_t> rank_of;  // a token's place in table->sorted(); -1: not a text token
  std::array<std::pair<size_t, size_t>, 256> first_byte_ranks{};  // [begin, end) by first byte
  mutable KeptMasks<ChartKey, Mask> state_masks{kMaxStateMasks};
};

size_t shared_prefix(const std::string& a, const std::string& b) {
  const size_t limit = std::min(a.size(), b.size());
  size_t n = 0;
  while (n < limit && a[n] == b[n]) ++n;
  return n;
}

class GrammarMatcher final : public Matcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const GrammarProgram> program)
      : program_(std::move(program)), chart_(&program_->cfg) {}

  std::unique_ptr<Matcher> clone() const override {
    return std::make_unique<GrammarMatcher>(*this);
  }

  TokenMask allowed() const override {
    const ChartKey key = chart_.key();
    Mask mask = program_->state_masks.find(key).value_or(nullptr);
    if (!mask) {
      mask = std::make_shared<const std::vector<uint64_t>>(allowed_tokens());
      program_->state_masks.keep(key, mask);
    }
    return {std::move(mask), program_->table->size()};
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
  std::vector<uint64_t> allowed_tokens() const {
    const TokenTable& table = *program_->table;
    std::vector<uint64_t> allowed((static_cast<size_t>(table.size()) + 63) / 64, 0);
    std::array<bool, 256> viable{};
    allow_whole_terminal_tokens(allowed, viable);
    if (!allow_parsed_tokens(candidates(allowed, viable), allowed)) allow_one_byte_tokens(allowed);
    if (chart_.complete())
      for (int32_t id : table.end_tokens()) mark(allowed, id);
    return allowed;
  }

  // Tokens a terminal the parse is inside (or before) reads whole: the parse goes on inside it.
  // `viable`: the bytes some such terminal reads next (no other byte can follow).
  void allow_whole_terminal_tokens(std::vector<uint64_t>& allowed,
                                   std::array<bool, 256>& viable) const {
    std::set<std::pair<int32_t, int32_t>> seen;
    chart_.each_scanning([&](int32_t terminal, int32_t state) {
      if (!seen.emplace(terminal, state).second) return;
      const ByteDfa& dfa = *program_->cfg.terminals[static_cast<size_t>(terminal)];
      for (int byte = 0; byte < 256; ++byte)
        viable[static_cast<size_t>(byte)] |= dfa.next(state, static_cast<uint8_t>(byte)) != 0;
      const auto mask = program_->terminal_masks[static_cast<size_t>(terminal)]->allowed(state);
      for (size_t word = 0; word < allowed.size(); ++word) allowed[word] |= (*mask)[word];
    });
  }

  // The tokens left to parse, as bits by sorted rank: not yet allowed, with a viable first
  // byte. Found from whichever side is smaller: the ranks of the viable first bytes, or the
  // tokens not yet allowed.
  std::vector<uint64_t> candidates(const std::vector<uint64_t>& allowed,
                                   const std::array<bool, 256>& viable) const {
    const GrammarProgram& p = *program_;
    const auto& sorted = p.table->sorted();
    std::vector<uint64_t> ranks((sorted.size() + 63) / 64, 0);
    size_t in_viable = 0, not_allowed = 0;
    for (int byte = 0; byte < 256; ++byte)
      if (viable[static_cast<size_t>(byte)])
        in_viable += p.first_byte_ranks[static_cast<size_t>(byte)].second -
                     p.first_byte_ranks[static_cast<size_t>(byte)].first;
    for (uint64_t word : allowed) not_allowed += 64 - static_cast<size_t>(std::popcount(word));
    auto is_allowed = [&](int32_t id) {
      return allowed[static_cast<size_t>(id) / 64] >> (id % 64) & 1;
    };
    if (in_viable <= not_allowed) {
      for (int byte = 0; byte < 256; ++byte) {
        if (!viable[static_cast<size_t>(byte)]) continue;
        const auto [begin, end] = p.first_byte_ranks[static_cast<size_t>(byte)];
        for (size_t rank = begin; rank < end; ++rank)
          if (!is_allowed(sorted[rank].first)) ranks[rank / 64] |= uint64_t{1} << (rank % 64);
      }
      return ranks;
    }
    for (size_t word = 0; word < allowed.size(); ++word) {
      for (uint64_t open = ~allowed[word]; open != 0; open &= open - 1) {
        const size_t id = word * 64 + static_cast<size_t>(std::countr_zero(open));
        if (id >= p.rank_of.size() || p.rank_of[id] < 0) continue;
        const auto rank = static_cast<size_t>(p.rank_of[id]);
        if (viable[static_cast<uint8_t>(p.table->bytes(static_cast<int32_t>(id))[0])])
          ranks[rank / 64] |= uint64_t{1} << (rank % 64);
      }
    }
    return ranks;
  }

  // The candidates through the chart, in sorted order. `held` rows above `base` hold the first
  // bytes of the last token parsed; a token sharing its first `dead` bytes fails with it.
  // Past the walk's budget the output can still go on a byte at a time.
  void allow_one_byte_tokens(std::vector<uint64_t>& allowed) const {
    const TokenTable& table = *program_->table;
    const size_t base = chart_.rows();
    for (const auto& [id, shared] : table.one_byte_tokens()) {
      if (allowed[static_cast<size_t>(id) / 64] >> (id % 64) & 1) continue;
      if (chart_.feed(static_cast<uint8_t>(table.bytes(id)[0]))) mark(allowed, id);
      chart_.pop_to(base);
    }
  }

  // The walk tries at most this many chart items (tens of milliseconds); past it only the
  // tokens already checked and the single bytes are allowed, so an ambiguous grammar cannot
  // stall a step.
  static constexpr size_t kMaxWalkItems = size_t{1} << 20;

  // False when the walk ran out of budget before the last candidate.
  bool allow_parsed_tokens(const std::vector<uint64_t>& ranks,
                           std::vector<uint64_t>& allowed) const {
    const TokenTable& table = *program_->table;
    constexpr size_t kNone = std::numeric_limits<size_t>::max();
    const size_t base = chart_.rows();
    const std::string* last = nullptr;
    size_t held = 0, dead = kNone, spent = 0;
    for (size_t word = 0; word < ranks.size() && spent <= kMaxWalkItems; ++word) {
      for (uint64_t open = ranks[word]; open != 0 && spent <= kMaxWalkItems; open &= open - 1) {
        const size_t rank = word * 64 + static_cast<size_t>(std::countr_zero(open));
        const int32_t id = table.sorted()[rank].first;
        const std::string& bytes = table.bytes(id);
        const size_t shared = last ? shared_prefix(*last, bytes) : 0;
        if (dead != kNone && shared >= dead) continue;
        size_t depth = std::min(held, shared);
        chart_.pop_to(base + depth);
        const uint64_t work = chart_.work();
        while (depth < bytes.size() && chart_.feed(static_cast<uint8_t>(bytes[depth]))) ++depth;
        spent += chart_.work() - work;
        last = &bytes;
        held = depth;
        dead = depth < bytes.size() ? depth + 1 : kNone;
        if (depth == bytes.size()) mark(allowed, id);
      }
    }
    chart_.pop_to(base);
    return spent <= kMaxWalkItems;
  }

  std::shared_ptr<const GrammarProgram> program_;
  // The mask's walk pushes rows and pops them again: the chart it leaves is the one it found
  // (with the keys of its rows made).
  mutable EarleyChart chart_;
};

using GrammarConstraint = ProgramConstraint<GrammarMatcher, GrammarProgram>;

}  // namespace

std::shared_ptr<const Constraint> grammar_constraint(std::shared_ptr<const TokenTable> table,
                                                     std::string_view grammar) {
  return std::make_shared<GrammarConstraint>(
      std::make_shared<GrammarProgram>(Cfg::lower(parse_grammar(grammar)), std::move(table)));
}

}  // namespace deepinfer::structured
