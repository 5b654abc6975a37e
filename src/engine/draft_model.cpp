#include "engine/draft_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace deepinfer {

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

std::vector<DraftModel::Proposal> DraftModel::propose(const std::vector<Ask>& asks,
                                                      double confidence_floor) {
  std::vector<Proposal> proposals(asks.size());
  // The sequences still drafting, and their tracks.
  std::vector<std::unique_ptr<DraftSampler>> going;
  std::vector<Track*> tracks;
  ForwardBatch batch;
  for (size_t i = 0; i < asks.size(); ++i) {
    const Ask& ask = asks[i];
    if (ask.limit <= 0 || ask.tokens.empty()) continue;
    Track& track = tracks_[ask.owner];
    if (!queue_catch_up(ask, track, batch)) continue;
    going.push_back(std::make_unique<DraftSampler>(ask, vocab_, proposals[i]));
    tracks.push_back(&track);
  }
  const auto stride = static_cast<size_t>(model_->config().vocab_size);
  while (!going.empty()) {
    const auto started = std::chrono::steady_clock::now();
    std::vector<float> logits = run(batch);
    ForwardBatch next;
    std::vector<std::unique_ptr<DraftSampler>> still;
    std::vector<Track*> still_tracks;
    for (size_t r = 0; r < going.size(); ++r) {
      DraftSampler& sampler = *going[r];
      if (!sampler.draw(logits.data() + r * stride) || sampler.confidence() < confidence_floor)
        continue;
      Track& track = *tracks[r];
      const auto at = static_cast<int64_t>(track.written.size());
      track.written.push_back(sampler.proposal().tokens.back());
      next.add_sequence({track.written.back()}, at, track.kv, cache_.shape().block_size, false);
      still.push_back(std::move(going[r]));
      still_tracks.push_back(&track);
    }
    costs_.observe(
        batch.num_tokens(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    batch = std::move(next);
    going = std::move(still);
    tracks = std::move(still_tracks);
  }
  return proposals;
}

}  // namespace deepinfer
