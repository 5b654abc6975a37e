#include "engine/drafter.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

void SpeculativeConfig::validate() const {
  if (method.empty()) return;
  DI_CHECK(method == "ngram", "speculative method '{}' is not one of: ngram", method);
  DI_CHECK(num_speculative_tokens >= 0 && num_speculative_tokens <= 64,
           "num_speculative_tokens {} is not in [0, 64]", num_speculative_tokens);
  DI_CHECK(prompt_lookup_min >= 1 && prompt_lookup_min <= prompt_lookup_max,
           "prompt_lookup_min {} must be at least 1 and at most prompt_lookup_max {}",
           prompt_lookup_min, prompt_lookup_max);
}

std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int min_n, int max_n,
                                  int64_t limit) {
  const auto size = static_cast<int64_t>(tokens.size());
  if (limit <= 0) return {};
  for (int64_t n = std::min<int64_t>(max_n, size - 1); n >= min_n; --n) {
    std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(size - n));
    // Latest occurrence first: recent context predicts the continuation best. Any earlier
    // start counts (runs of one token overlap themselves); a token always follows it.
    for (int64_t start = size - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min(limit, size - from);
      return {tokens.begin() + from, tokens.begin() + from + count};
    }
  }
  return {};
}

}  // namespace deepinfer
