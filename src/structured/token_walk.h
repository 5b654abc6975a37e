// The token mask of a byte-level automaton: a walk of the sorted vocabulary in which a prefix
// shared by neighbouring tokens is fed once, and every token below a prefix the automaton
// rejects is skipped without being looked at.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "structured/regex.h"
#include "structured/structured.h"

namespace deepinfer::structured {

// A token allowed: in a flag per token, or in bits by token id (64 a word).
inline void mark(std::vector<bool>& allowed, int32_t id) {
  allowed[static_cast<size_t>(id)] = true;
}
inline void mark(std::vector<uint64_t>& bits, int32_t id) {
  bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
}

// Marks in `allowed` every token of `tokens` (TokenTable::sorted or string_sensitive) that
// `start` accepts whole (State: copyable, with bool feed(uint8_t)).
template <typename State, typename Marks>
void allow_fed_tokens(const State& start, const TokenTable& table, const SortedTokens& tokens,
                      Marks& allowed) {
  // states[d] is the automaton after the first d bytes of the current token; `valid` is how
  // deep the previous token got: the tokens after it that share more with it fail too, and are
  // jumped over. Slots past the current depth are kept, and overwritten by copy-assignment,
  // which reuses their buffers: a walk copies the automaton for every byte it tries.
  std::vector<State> states(1, start);
  size_t valid = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].second > valid) {
      i = tokens.next_within(i, static_cast<uint32_t>(valid));
      if (i == tokens.size()) break;
    }
    const std::string& bytes = table.bytes(tokens[i].first);
    const size_t common = tokens[i].second;
    size_t depth = common;
    for (; depth < bytes.size(); ++depth) {
      if (states.size() == depth + 1) {
        states.push_back(states[depth]);
      } else {
        states[depth + 1] = states[depth];
      }
      if (!states[depth + 1].feed(static_cast<uint8_t>(bytes[depth]))) break;
    }
    valid = depth;
    if (depth == bytes.size()) mark(allowed, tokens[i].first);
  }
}

// Marks in `allowed` every token of `tokens` that automaton `dfa` reads whole from `state`
// without dying (allow_fed_tokens with integer states: no copies).
template <typename Marks>
void allow_dfa_tokens(const ByteDfa& dfa, int state, const TokenTable& table,
                      const SortedTokens& tokens, Marks& allowed) {
  std::vector<int> states(1, state);
  size_t valid = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].second > valid) {
      i = tokens.next_within(i, static_cast<uint32_t>(valid));
      if (i == tokens.size()) break;
    }
    const auto& [id, shared] = tokens[i];
    const std::string& bytes = table.bytes(id);
    states.resize(shared + 1);
    size_t depth = shared;
    for (; depth < bytes.size(); ++depth) {
      const int next = dfa.next(states[depth], static_cast<uint8_t>(bytes[depth]));
      if (next == ByteDfa::kDead) break;
      states.push_back(next);
    }
    valid = depth;
    if (depth == bytes.size()) mark(allowed, id);
  }
}

}  // namespace deepinfer::structured
