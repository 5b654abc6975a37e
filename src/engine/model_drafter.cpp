#include "engine/model_drafter.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {

namespace {

// The most likely of `vocab` logits and its softmax probability; logits 30 below the best add
// under 1e-13 each and are skipped.
std::pair<int32_t, double> most_likely(const float* logits, int32_t vocab) {
  const auto best = static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  const float top = logits[best];
  double total = 0.0;
  for (int32_t i = 0; i < vocab; ++i) {
    const float gap = logits[i] - top;
    if (gap > -30.0f) total += std::exp(gap);
  }
  return {best, 1.0 / total};
}

}  // namespace

DraftSampler::DraftSampler(const DraftAsk& ask, int32_t vocab, DraftProposal& proposal)
    : ask_(&ask),
      vocab_(vocab),
      proposal_(&proposal),
      penalised_(!sampling::needs_only_logits(*ask.params)) {
  if (penalised_) history_ = *ask.history;
  if (ask.matcher) matcher_ = ask.matcher->clone();
}

bool DraftSampler::draw(const float* logits) {
  const sampling::SamplingParams& params = *ask_->params;
  std::vector<float> masked;
  if (matcher_) {
    masked.assign(logits, logits + vocab_);
    matcher_->mask_logits(masked.data(), vocab_);
    logits = masked.data();
  }
  const auto depth = static_cast<uint64_t>(proposal_->tokens.size());
  int32_t token = 0;
  double confidence = 0.0;
  if (params.temperature == 0.0f && !penalised_) {
    std::tie(token, confidence) = most_likely(logits, vocab_);
  } else if (params.temperature == 0.0f) {
    // The most likely token after the penalties and bias, as the target's greedy pick.
    sampling::SamplingParams softmax = params;
    softmax.temperature = 1.0f;
    softmax.top_k = 0;
    softmax.top_p = 1.0f;
    softmax.min_p = 0.0f;
    const std::vector<float> q = sampling::distribution(logits, vocab_, softmax, history_);
    token = static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin());
    confidence = q[static_cast<size_t>(token)];
  } else {
    std::vector<float> q = sampling::distribution(logits, vocab_, params, history_);
    token = sampling::draw_from(
        q,
        sampling::counter_uniform(sampling::stream_seed(ask_->seed, sampling::DrawStream::kDraft),
                                  ask_->position + depth));
    confidence = q[static_cast<size_t>(token)];
    proposal_->distributions.push_back(std::move(q));
  }
  proposal_->tokens.push_back(token);
  proposal_->confidence.push_back(confidence);
  confidence_ *= confidence;
  if (penalised_) history_.add_output(token);
  const bool fits = !matcher_ || matcher_->accept(token);
  return fits && static_cast<int64_t>(proposal_->tokens.size()) < ask_->limit;
}

}  // namespace deepinfer
