// Speculative decoding's drafts: tokens proposed for a sequence so that one forward verifies
// several of them at once (the engine keeps the ones the target model would have produced
// itself, see Engine). N-gram prompt lookup proposes what followed the latest earlier
// occurrence of the sequence's last few tokens: free to compute, and often right on code,
// quotes and structured output, which repeat their input.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"

namespace deepinfer {

struct SpeculativeConfig {
  std::string method;              // "" (off), "ngram", "draft_model" or "mtp"
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

// A forward's time by its token count: each size's recent time (profiled at start, then
// updated by every step with recent ones weighing most), interpolated between the sizes
// measured and extended past the largest with the slope of the two largest. A table rather
// than a line: on a CPU a few rows cost far less per token than many (different kernels), and
// on a GPU the time stays flat until the batch fills the machine.
class StepCosts {
 public:
  void observe(int64_t tokens, double seconds);
  // Whether two sizes at least were measured.
  bool known() const { return times_.size() >= 2; }
  double seconds(int64_t tokens) const;

 private:
  static constexpr double kNewWeight = 0.2;
  std::map<int64_t, double> times_;
};

// Times forwards of 1, 2, 4, ... `largest` tokens (one scratch sequence in free blocks of
// `cache`, given back after) into `costs`, stopping after one that takes a quarter second;
// nothing when the cache cannot hold them.
void profile_forward_costs(CausalLM& model, KvCache& cache, int64_t largest, StepCosts& costs);

// One decoding request's drafts on offer and how often its drafts were accepted.
struct DraftOffer {
  int64_t proposed = 0;     // drafts available
  double acceptance = 0.0;  // the chance each next draft is accepted, given the ones before
  // Per draft, its own such chance where the drafter knows one (a draft model's confidence);
  // empty: `acceptance` for every draft.
  std::vector<double> chances;
  // A draft model: the tokens its first forward computes for this request (those it has not
  // seen yet, the last one included).
  int64_t catch_up = 1;
  double chance(size_t draft) const { return draft < chances.size() ? chances[draft] : acceptance; }
};

// How many drafts each offer verifies this step. A request's k-th draft adds the product of
// its first k chances in expected tokens, so the best n drafts are the n most likely ones;
// n is the count that maximises expected tokens per second of the step: `rows` tokens
// without drafts plus the drafts' expected ones, over the step's time at `tokens` + n tokens
// plus, when `draft_costs` is given (the drafts are not made yet), the draft model's
// forwards: one per draft depth over the requests drafting that deep, the first one with the
// tokens each must catch up on.
std::vector<int64_t> verified_drafts(const std::vector<DraftOffer>& offers, int64_t rows,
                                     int64_t tokens, const StepCosts& costs,
                                     const StepCosts* draft_costs = nullptr);

// The tokens that followed the latest earlier occurrence of the longest suffix of `tokens`
// (from max_n down to min_n tokens long) that occurred before, at most `limit` of them; none
// when no such suffix recurs.
std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int min_n, int max_n,
                                  int64_t limit);

}  // namespace deepinfer
