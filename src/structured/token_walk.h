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
  // jumped over.
  std::vector<State> states(1, start);
  size_t valid = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].second > valid) {
      i = tokens.next_within(i, static_cast<uint32_t>(valid));
      if (i == tokens.size()) break;
    }
    const std::string& bytes = table.bytes(tokens[i].first);
    const size_t common = tokens[i].second;
    states.erase(states.begin() + static_cast<std::ptrdiff_t>(common) + 1, states.end());
    size_t depth = common;
    for (; depth < bytes.size(); ++depth) {
      State next = states[depth];
      if (!next.feed(static_cast<uint8_t>(bytes[depth]))) break;
      states.push_back(std::move(next));
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

// Four logits kept or banned by four bits, as bit masks (the compiler makes it one vector
// and/andnot/or).
inline void keep_four(float* logits, unsigned bits) {
  static const auto kLanes = [] {
    std::array<std::array<uint32_t, 4>, 16> lanes{};
    for (unsigned n = 0; n < 16; ++n)
      for (unsigned k = 0; k < 4; ++k) lanes[n][k] = (n >> k & 1) ? ~0u : 0u;
    return lanes;
  }();
  constexpr uint32_t kBannedBits = 0xFF800000u;  // -infinity
  uint32_t values[4];
  std::memcpy(values, logits, sizeof(values));
  const std::array<uint32_t, 4>& keep = kLanes[bits];
  for (unsigned k = 0; k < 4; ++k) values[k] = (values[k] & keep[k]) | (~keep[k] & kBannedBits);
  std::memcpy(logits, values, sizeof(values));
}

// Bans every logit whose bit in `allowed` (by token id, 64 a word, `known` tokens) is clear,
// and every id from `known` on. Word by word: whole words allowed or banned are common; the
// rest select without branches.
inline void apply_mask_bits(const std::vector<uint64_t>& allowed, int32_t table_size, float* logits,
                            int32_t vocab_size) {
  const auto known = static_cast<size_t>(std::min(vocab_size, table_size));
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  for (size_t word = 0; word * 64 < known; ++word) {
    const uint64_t bits = allowed[word];
    if (bits == ~uint64_t{0}) continue;
    float* row = logits + word * 64;
    const size_t count = std::min<size_t>(64, known - word * 64);
    size_t b = 0;
    for (; b + 4 <= count; b += 4) keep_four(row + b, static_cast<unsigned>(bits >> b & 15));
    for (; b < count; ++b) row[b] = (bits >> b & 1) ? row[b] : kBanned;
  }
  for (auto id = static_cast<int32_t>(known); id < vocab_size; ++id) logits[id] = kBanned;
}

// Sets every logit `allowed` does not mark to -infinity (ids past the table's vocabulary, the
// model's padding rows, included).
inline void ban_others(const std::vector<bool>& allowed, float* logits, int32_t vocab_size) {
  for (int32_t id = 0; id < vocab_size; ++id)
    if (static_cast<size_t>(id) >= allowed.size() || !allowed[static_cast<size_t>(id)])
      logits[id] = -std::numeric_limits<float>::infinity();
}

}  // namespace deepinfer::structured
