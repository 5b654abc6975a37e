// Speculative decoding's drafts: tokens proposed for a sequence so that one forward verifies
// several of them at once (the engine keeps the ones the target model would have produced
// itself, see Engine). N-gram prompt lookup proposes what followed the latest earlier
// occurrence of the sequence's last few tokens: free to compute, and often right on code,
// quotes and structured output, which repeat their input.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace deepinfer {

struct SpeculativeConfig {
  std::string method;              // "" (off) or "ngram"
  int num_speculative_tokens = 5;  // drafts verified per step at most
  // N-gram lookup: the longest suffix tried first, the shortest accepted last.
  int prompt_lookup_min = 1;
  int prompt_lookup_max = 4;

  bool enabled() const { return !method.empty() && num_speculative_tokens > 0; }
  // Throws Error naming the field when a value is out of range or the method unknown.
  void validate() const;
};

// The tokens that followed the latest earlier occurrence of the longest suffix of `tokens`
// (from max_n down to min_n tokens long) that occurred before, at most `limit` of them; none
// when no such suffix recurs.
std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int min_n, int max_n,
                                  int64_t limit);

}  // namespace deepinfer
