// Token masks as bits by token id (64 a word), applied to a row of logits: shared by the
// grammar matchers, which make them, and the backends, which apply them where the logits are.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace deepinfer {

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

// Sets to -infinity every logit of `logits` [vocab_size] whose bit in `allowed` (the first
// `marked` token ids) is clear, and every id from `marked` on. Word by word: whole words
// allowed or banned are common; the rest select without branches.
inline void ban_unmarked(const uint64_t* allowed, int32_t marked, float* logits,
                         int32_t vocab_size) {
  const auto known = static_cast<size_t>(std::max(0, std::min(vocab_size, marked)));
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

}  // namespace deepinfer
