#include "engine/draft_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

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

// One sequence drafting in this call: what it drafts with, ahead of the sequence's own state.
struct DraftModel::Drafting {
  const Ask* ask = nullptr;
  Track* track = nullptr;
  Proposal* proposal = nullptr;
  // Penalties or bias apply: the sequence's history, with the drafts so far.
  bool penalised = false;
  sampling::TokenHistory history;
  std::unique_ptr<structured::Matcher> matcher;
  double confidence = 1.0;  // in all drafts so far
  bool done = false;
};

DraftModel::DraftModel(std::unique_ptr<CausalLM> model, int32_t vocab, int block_size,
                       int64_t num_blocks)
    : model_(std::move(model)),
      vocab_(vocab),
      cache_(model_->kv_shape(block_size), num_blocks, model_->ops()) {
  DI_CHECK(model_->config().vocab_size >= vocab,
           "the draft model's vocabulary of {} tokens lacks ids the target samples (up to {})",
           model_->config().vocab_size, vocab);
  profile_forward_costs(*model_, cache_, kProfiledRows, costs_);
}

void DraftModel::forget(const void* owner) {
  auto found = tracks_.find(owner);
  if (found == tracks_.end()) return;
  found->second.kv.release_all(cache_);
  tracks_.erase(found);
}

int64_t DraftModel::matching(const Track& track, std::span<const int32_t> tokens) {
  const auto end =
      std::min(static_cast<int64_t>(track.written.size()), static_cast<int64_t>(tokens.size()));
  int64_t count = std::min(track.confirmed, end);
  while (count < end &&
         track.written[static_cast<size_t>(count)] == tokens[static_cast<size_t>(count)])
    ++count;
  return count;
}

int64_t DraftModel::catch_up(const void* owner, std::span<const int32_t> tokens) const {
  auto found = tracks_.find(owner);
  const auto length = static_cast<int64_t>(tokens.size());
  if (found == tracks_.end()) return length;
  return length - std::min(matching(found->second, tokens), length - 1);
}

bool DraftModel::queue_catch_up(const Ask& ask, Track& track, ForwardBatch& batch) {
  const auto length = static_cast<int64_t>(ask.tokens.size());
  int64_t& confirmed = track.confirmed;
  // The last token is always computed again: its row gives the first draft.
  confirmed = std::min(matching(track, ask.tokens), length - 1);
  if (!track.kv.try_reserve(cache_, length + ask.limit - 1)) return false;
  track.written.assign(ask.tokens.begin(), ask.tokens.end());
  std::vector<int32_t> fresh(ask.tokens.begin() + confirmed, ask.tokens.end());
  batch.add_sequence(fresh, confirmed, track.kv, cache_.shape().block_size, false);
  return true;
}

std::vector<float> DraftModel::run(const ForwardBatch& batch) {
  const int64_t vocab = model_->config().vocab_size;
  std::vector<float> logits(batch.logit_rows.size() * static_cast<size_t>(vocab));
  model_->forward(batch, cache_, logits.data());
  return logits;
}

// The next draft from the draft model's logits: drawn from its distribution under the
// request's parameters (a stream of draws of its own), or its most likely token for greedy
// requests; the constraint masks both.
void DraftModel::draw(Drafting& drafting, const float* logits) {
  const Ask& ask = *drafting.ask;
  const sampling::SamplingParams& params = *ask.params;
  Proposal& proposal = *drafting.proposal;
  std::vector<float> masked;
  if (drafting.matcher) {
    masked.assign(logits, logits + vocab_);
    drafting.matcher->mask_logits(masked.data(), vocab_);
    logits = masked.data();
  }
  const auto depth = static_cast<uint64_t>(proposal.tokens.size());
  int32_t token = 0;
  double confidence = 0.0;
  if (params.temperature == 0.0f && !drafting.penalised) {
    std::tie(token, confidence) = most_likely(logits, vocab_);
  } else if (params.temperature == 0.0f) {
    // The most likely token after the penalties and bias, as the target's greedy pick.
    sampling::SamplingParams softmax = params;
    softmax.temperature = 1.0f;
    softmax.top_k = 0;
    softmax.top_p = 1.0f;
    softmax.min_p = 0.0f;
    const std::vector<float> q = sampling::distribution(logits, vocab_, softmax, drafting.history);
    token = static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin());
    confidence = q[static_cast<size_t>(token)];
  } else {
    std::vector<float> q = sampling::distribution(logits, vocab_, params, drafting.history);
    token = sampling::draw_from(
        q, sampling::counter_uniform(sampling::stream_seed(ask.seed, sampling::DrawStream::kDraft),
                                     ask.position + depth));
    confidence = q[static_cast<size_t>(token)];
    proposal.distributions.push_back(std::move(q));
  }
  proposal.tokens.push_back(token);
  proposal.confidence.push_back(confidence);
  drafting.confidence *= confidence;
  if (drafting.penalised) drafting.history.add_output(token);
  const bool fits = !drafting.matcher || drafting.matcher->accept(token);
  drafting.done = !fits || static_cast<int64_t>(proposal.tokens.size()) >= ask.limit;
}

std::vector<DraftModel::Proposal> DraftModel::propose(const std::vector<Ask>& asks,
                                                      double confidence_floor) {
  std::vector<Proposal> proposals(asks.size());
  std::vector<Drafting> going;
  ForwardBatch batch;
  for (size_t i = 0; i < asks.size(); ++i) {
    const Ask& ask = asks[i];
    if (ask.limit <= 0 || ask.tokens.empty()) continue;
    Track& track = tracks_[ask.owner];
    if (!queue_catch_up(ask, track, batch)) continue;
    Drafting& drafting = going.emplace_back();
    drafting.ask = &ask;
    drafting.track = &track;
    drafting.proposal = &proposals[i];
    drafting.penalised = !sampling::needs_only_logits(*ask.params);
    if (drafting.penalised) drafting.history = *ask.history;
    if (ask.matcher) drafting.matcher = ask.matcher->clone();
  }
  const auto stride = static_cast<size_t>(model_->config().vocab_size);
  while (!going.empty()) {
    const auto started = std::chrono::steady_clock::now();
    std::vector<float> logits = run(batch);
    ForwardBatch next;
    std::vector<Drafting> still;
    for (size_t r = 0; r < going.size(); ++r) {
      Drafting& drafting = going[r];
      draw(drafting, logits.data() + r * stride);
      if (drafting.done || drafting.confidence < confidence_floor) continue;
      Track& track = *drafting.track;
      const auto at = static_cast<int64_t>(track.written.size());
      track.written.push_back(drafting.proposal->tokens.back());
      next.add_sequence({track.written.back()}, at, track.kv, cache_.shape().block_size, false);
      still.push_back(std::move(drafting));
    }
    costs_.observe(
        batch.num_tokens(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    batch = std::move(next);
    going = std::move(still);
  }
  return proposals;
}

}  // namespace deepinfer
