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
  std::string method;              // "" (off), "ngram" or "draft_model"
  int num_speculative_tokens = 5;  // drafts verified per step at most
  // draft_model: the draft's Hugging Face folder; it must share the target's vocabulary.
  std::string model;
  // draft_model: a sequence stops drafting once the draft's confidence in all its drafts so
  // far (the product of each draft's probability under the draft model) falls below this.
  double confidence_threshold = 0.05;
  // N-gram lookup: the longest suffix tried first, the shortest accepted last.
  int prompt_lookup_min = 1;
  int prompt_lookup_max = 4;
  // How many drafts are verified: "adaptive" (each step, as many as raise the expected
  // tokens per second of step time, from each request's acceptance so far and the measured
  // cost of a step by its token count) or "always" (every draft proposed, up to
  // num_speculative_tokens).
  std::string verification = "adaptive";

  bool enabled() const { return !method.empty() && num_speculative_tokens > 0; }
  // Throws Error naming the field when a value is out of range or the method unknown.
  void validate() const;
};

// A step's forward time as a line in its token count, fitted to the steps seen so far with
// recent ones weighing most: what one more verified token costs next to the step's fixed part.
class StepCosts {
 public:
  void observe(int64_t tokens, double seconds);
  // Whether the steps seen so far vary enough in size to tell the two parts apart.
  bool known() const;
  double fixed_seconds() const;      // the intercept, at least 0
  double seconds_per_token() const;  // the slope, at least 0

 private:
  static constexpr double kDecay = 0.98;
  double weight_ = 0, x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;
};

// One decoding request's drafts on offer and how often its drafts were accepted.
struct DraftOffer {
  int64_t proposed = 0;     // drafts available
  double acceptance = 0.0;  // the chance each next draft is accepted, given the ones before
  // Per draft, its own such chance where the drafter knows one (a draft model's confidence);
  // empty: `acceptance` for every draft.
  std::vector<double> chances;
  double chance(size_t draft) const { return draft < chances.size() ? chances[draft] : acceptance; }
};

// How many drafts each offer verifies this step: the next draft of a request is expected to
// add acceptance^k tokens for one more token of step time, so drafts are taken, most likely
// first, while each adds more tokens than the step's current rate of tokens per unit of time
// would. `rows` requests produce a token each and `tokens` are computed without drafts;
// `seconds_per_draft` is what making a draft costs beside verifying it (0 once it is made).
std::vector<int64_t> verified_drafts(const std::vector<DraftOffer>& offers, int64_t rows,
                                     int64_t tokens, const StepCosts& costs,
                                     double seconds_per_draft = 0.0);

// The tokens that followed the latest earlier occurrence of the longest suffix of `tokens`
// (from max_n down to min_n tokens long) that occurred before, at most `limit` of them; none
// when no such suffix recurs.
std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int min_n, int max_n,
                                  int64_t limit);

}  // namespace deepinfer
