// The token mask of a byte-level automaton: a walk of the sorted vocabulary in which a prefix
// shared by neighbouring tokens is fed once, and every token below a prefix the automaton
// rejects is skipped without being looked at.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "structured/structured.h"

namespace deepinfer::structured {

// Marks in `allowed` every token of `tokens` (sorted, with shared prefixes: TokenTable::sorted
// or string_sensitive) that `start` accepts whole (State: copyable, with bool feed(uint8_t)).
template <typename State>
void allow_fed_tokens(const State& start, const TokenTable& table,
                      const std::vector<std::pair<int32_t, uint32_t>>& tokens,
                      std::vector<bool>& allowed) {
  // states[d] is the automaton after the first d bytes of the current token; `valid` is how
  // deep the previous token got (a token sharing a longer prefix with it fails too).
  std::vector<State> states(1, start);
  size_t valid = 0;
  for (const auto& [id, shared] : tokens) {
    if (shared > valid) continue;
    const std::string& bytes = table.bytes(id);
    states.erase(states.begin() + static_cast<std::ptrdiff_t>(shared) + 1, states.end());
    size_t depth = shared;
    for (; depth < bytes.size(); ++depth) {
      State next = states[depth];
      if (!next.feed(static_cast<uint8_t>(bytes[depth]))) break;
      states.push_back(std::move(next));
    }
    valid = depth;
    if (depth == bytes.size()) allowed[static_cast<size_t>(id)] = true;
  }
}

// Sets every logit `allowed` does not mark to -infinity (ids past the table's vocabulary, the
// model's padding rows, included).
inline void ban_others(const std::vector<bool>& allowed, float* logits, int32_t vocab_size) {
  for (int32_t id = 0; id < vocab_size; ++id)
    if (static_cast<size_t>(id) >= allowed.size() || !allowed[static_cast<size_t>(id)])
      logits[id] = -std::numeric_limits<float>::infinity();
}

}  // namespace deepinfer::structured
