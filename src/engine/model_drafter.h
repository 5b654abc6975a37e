// What speculative decoding's model drafters share (a draft model, DeepSeek's MTP modules):
// how the engine asks for drafts, what comes back, and how a draft is drawn from a drafter's
// logits under the request's own sampling parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/drafter.h"
#include "sampling/sampling.h"
#include "structured/structured.h"

namespace deepinfer {

// One sequence's request for drafts after its tokens.
struct DraftAsk {
  const void* owner = nullptr;  // identifies the sequence's drafter state between calls
  std::span<const int32_t> tokens;
  int64_t limit = 0;  // drafts at most
  const sampling::SamplingParams* params = nullptr;
  const sampling::TokenHistory* history = nullptr;
  const structured::Matcher* matcher = nullptr;  // the sequence's constraint, if any
  uint64_t seed = 0;                             // the sequence's draw seed
  uint64_t position = 0;                         // the output position of the first draft
};

struct DraftProposal {
  std::vector<int32_t> tokens;
  // Sampled requests: the distribution each draft was drawn from ([vocab] each).
  std::vector<std::vector<float>> distributions;
  // Per draft, the drafter's probability of it: its confidence.
  std::vector<double> confidence;
};

// Draws one sequence's drafts from a drafter's logits: from the drafter's distribution under
// the request's parameters (a stream of draws of its own) for sampled requests, the most
// likely token (after penalties and bias) for greedy ones; the constraint masks both. Its
// history and matcher run ahead of the sequence's own.
class DraftSampler {
 public:
  DraftSampler(const DraftAsk& ask, int32_t vocab, DraftProposal& proposal);
  // Draws the next draft from `logits` ([vocab] at least); false once the sequence can draft
  // no further (its limit, or the constraint ended).
  bool draw(const float* logits);
  // The product of the drafts' confidence so far.
  double confidence() const { return confidence_; }
  const DraftAsk& ask() const { return *ask_; }
  const DraftProposal& proposal() const { return *proposal_; }

 private:
  const DraftAsk* ask_;
  int32_t vocab_;
  DraftProposal* proposal_;
  bool penalised_;  // penalties or bias apply: history_ is kept
  sampling::TokenHistory history_;
  std::unique_ptr<structured::Matcher> matcher_;
  double confidence_ = 1.0;
};

// A drafter that runs a model (SpeculativeConfig::method "draft_model" or "mtp").
class ModelDrafter {
 public:
  using Ask = DraftAsk;
  using Proposal = DraftProposal;
  virtual ~ModelDrafter() = default;
  // Drafts for every ask, in order. A sequence stops once the product of its drafts'
  // confidence falls below `confidence_floor`; one the drafter cannot serve gets none.
  virtual std::vector<Proposal> propose(const std::vector<Ask>& asks, double confidence_floor) = 0;
  // The tokens the drafter's first forward computes for `owner` before its first draft.
  virtual int64_t catch_up(const void* owner, std::span<const int32_t> tokens) const = 0;
  // The sequence's state is given back (it finished or was preempted).
  virtual void forget(const void* owner) = 0;
  // One of the drafter's forwards (with its draws) by its token count.
  virtual const StepCosts& costs() const = 0;
  // The bytes a token takes in the drafter's own KV cache.
  virtual double kv_bytes_per_token() const = 0;
};

}  // namespace deepinfer
