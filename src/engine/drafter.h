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
// updated by every step with recent ones weighing most; a size never answers less than a
// smaller one), interpolated between the sizes measured and extended past the largest with
// the slope of the two largest. A table rather than a line: on a CPU a few rows cost far
// less per token than many (different kernels), and on a GPU the time stays flat until the
// batch fills the machine.
class StepCosts {
 public:
  // A forward timed with care (warm, the fastest of several): taken as it is.
  void measured(int64_t tokens, double seconds);
  // A step's time: moves its size's by a bounded share.
  void observe(int64_t tokens, double seconds);
  // Whether two sizes at least were measured.
  bool known() const { return times_.size() >= 2; }
  double seconds(int64_t tokens) const;

 private:
  static constexpr double kNewWeight = 0.2;
  static constexpr double kLargestRatio = 2.0;  // of a step's time to its size's, counted
  void refresh_monotone(std::map<int64_t, double>::const_iterator changed);
  std::map<int64_t, double> times_;
  // times_ with each size's time at least every smaller size's, what seconds() reads.
  std::vector<std::pair<int64_t, double>> monotone_;
};

// Times forwards of 1, 2, 4, ... `largest` tokens (one scratch sequence in free blocks of
// `cache`, given back after) into `costs`, stopping after one that takes a quarter second;
// nothing when the cache cannot hold them.
void profile_forward_costs(CausalLM& model, KvCache& cache, int64_t largest, StepCosts& costs);

// Trials of draft acceptance: each draft up to the first rejected one is one trial, recent
// trials weighing most.
struct AcceptanceTrials {
  double accepted = 0.0;
  double trials = 0.0;
};

// How likely a request's next draft is accepted. Its own recent trials, shrunk toward the
// drafter's pooled rate over every request's recent trials, so a new request starts from what
// the drafter has been doing lately: a draft model that never agrees with the target stops
// drafting after one step of the whole batch, rather than each request spending its first
// steps finding that out alone, and a request with few trials of its own is not judged on
// them.
class AcceptanceModel {
 public:
  explicit AcceptanceModel(double prior = 0.6);
  double chance(const AcceptanceTrials& own) const;
  // One verification: `accepted` drafts kept of `drafts` verified.
  void observe(AcceptanceTrials& own, int64_t accepted, int64_t drafts);
  double pooled() const;
  // The pooled trials' weight (recent trials of every request).
  double evidence() const { return pooled_.trials; }

 private:
  static constexpr double kOwnKeep = 0.95;      // per trial: about 20 recent ones count
  static constexpr double kPooledKeep = 0.995;  // about 200
  // The prior's weight in the pooled rate, as trials (one early rejection does not end a
  // drafter's chances, and a stream of them brings it near zero), and the pooled rate's in a
  // request's: a few trials, as requests differ (one repeats its context, the next never),
  // and a request's own recent ones soon outweigh it.
  static constexpr double kPriorTrials = 20.0;
  static constexpr double kShrinkTrials = 5.0;
  double prior_;
  AcceptanceTrials pooled_;
};

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
  // What a catch-up of more than a step's few tokens is spread over: the steps the request
  // has left if it drafts from now on, but no more than the drafter's trials so far (a
  // catch-up pays back only while drafting goes on, and a drafter not yet seen agreeing with
  // the target pays its first catch-ups in full).
  double catch_up_steps = 1.0;
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
