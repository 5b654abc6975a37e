// Token masks of one byte automaton, per state: the tokens it reads whole from a state without
// dying, kept by the vocabulary's table (shared by every constraint that builds the same
// automaton).
#pragma once

#include <memory>
#include <vector>

#include "structured/regex.h"
#include "structured/structured.h"
#include "structured/token_walk.h"

namespace deepinfer::structured {

class DfaMasks {
 public:
  using Mask = TokenTable::Bits;

  // `ends`: the end tokens are allowed in accepting states (the automaton is the whole
  // output), else never (it is one terminal of a grammar).
  DfaMasks(const ByteDfa& dfa, const TokenTable& table, bool ends)
      : dfa_(dfa), table_(table), ends_(ends) {}

  Mask allowed(int state) const {
    const auto [low, high] = dfa_.fingerprint();
    const uint64_t kind = ends_ ? kWholeWithEnds : kWhole;
    return table_.shared_bits({low, high, static_cast<uint64_t>(state), kind},
                              [&] { return build(state); });
  }

  // What TokenTable::shared_bits keys hold, beside the automaton and state.
  static constexpr uint64_t kWhole = 1, kWholeWithEnds = 2, kPlainFits = 3;

 private:
  std::vector<uint64_t> build(int state) const {
    std::vector<uint64_t> bits((static_cast<size_t>(table_.size()) + 63) / 64, 0);
    allow_dfa_tokens(dfa_, state, table_, table_.sorted(), bits);
    if (ends_ && dfa_.accepting(state))
      for (int32_t id : table_.end_tokens()) mark(bits, id);
    return bits;
  }

  const ByteDfa& dfa_;
  const TokenTable& table_;
  bool ends_;
};

}  // namespace deepinfer::structured
