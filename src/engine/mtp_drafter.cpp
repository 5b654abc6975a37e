#include "engine/mtp_drafter.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace deepinfer {

MtpDrafter::MtpDrafter(CausalLM& model, int32_t vocab, int block_size, int64_t num_blocks,
                       int64_t max_chain)
    : model_(model),
      vocab_(vocab),
      max_chain_(std::max<int64_t>(max_chain, 1)),
      cache_(model.mtp_kv_shape(block_size), num_blocks, model.ops()) {
  DI_CHECK(model.num_mtp_modules() > 0,
           "speculative method 'mtp': {} has no multi-token-prediction modules "
           "(num_nextn_predict_layers)",
           model.config().architecture);
}

void MtpDrafter::forget(const void* owner) {
  auto found = tracks_.find(owner);
  if (found == tracks_.end()) return;
  found->second.kv.release_all(cache_);
  tracks_.erase(found);
}

void MtpDrafter::run(const ForwardBatch& batch, const std::vector<float>& previous,
                     std::vector<float>& hidden, std::vector<float>& logits) {
  Ops& ops = model_.ops();
  const int64_t rows = batch.num_tokens(), width = model_.config().hidden_size;
  const int64_t vocab = model_.config().vocab_size;
  const auto out_rows = static_cast<int64_t>(batch.logit_rows.size());
  BackendTensor previous_state(ops, {rows, width});
  ops.to_backend(previous_state.data(), previous.data(), previous.size() * sizeof(float));
  BackendTensor state(ops, {rows, width});
  BackendTensor scores(ops, {std::max<int64_t>(out_rows, 1), vocab});
  Tensor state_view = state.view(), scores_view = scores.view();
  scores_view.shape[0] = out_rows;
  model_.mtp_forward(0, batch, previous_state.view(), cache_, state_view, scores_view);
  hidden.resize(static_cast<size_t>(rows * width));
  logits.resize(static_cast<size_t>(out_rows * vocab));
  ops.to_host(hidden.data(), state.data(), hidden.size() * sizeof(float));
  ops.to_host(logits.data(), scores.data(), logits.size() * sizeof(float));
}

void MtpDrafter::absorb(const std::vector<Rows>& rows) {
  const auto width = static_cast<size_t>(model_.config().hidden_size);
  const auto vocab = static_cast<size_t>(model_.config().vocab_size);
  ForwardBatch batch;
  std::vector<float> previous;
  std::vector<Track*> absorbing;
  for (const Rows& part : rows) {
    const int64_t count =
        std::min(part.count, static_cast<int64_t>(part.tokens.size()) - 1 - part.start);
    if (count <= 0) continue;
    Track& track = tracks_[part.owner];
    // Positions before the module's last ones are written again (a preempted sequence
    // recomputing); the module starts over then. A gap (a cached prefix the target did not
    // compute) is attended around: the module's slots are its own.
    if (part.start < track.next_position) {
      track.kv.release_all(cache_);
      track = Track{};
    }
    if (!track.kv.try_reserve(cache_, track.absorbed + count + max_chain_)) continue;
    std::vector<int32_t> next_tokens(part.tokens.begin() + part.start + 1,
                                     part.tokens.begin() + part.start + 1 + count);
    const size_t first_row = batch.tokens.size();
    batch.add_sequence(next_tokens, track.absorbed, track.kv, cache_.shape().block_size, false);
    for (int64_t i = 0; i < count; ++i)
      batch.positions[first_row + static_cast<size_t>(i)] = static_cast<int32_t>(part.start + i);
    previous.insert(previous.end(), part.hidden, part.hidden + count * static_cast<int64_t>(width));
    track.absorbed += count;
    track.next_position = part.start + count;
    absorbing.push_back(&track);
  }
  if (absorbing.empty()) return;
  const auto started = std::chrono::steady_clock::now();
  std::vector<float> hidden, logits;
  run(batch, previous, hidden, logits);
  costs_.observe(batch.num_tokens(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  for (size_t s = 0; s < absorbing.size(); ++s) {
    Track& track = *absorbing[s];
    const auto last = static_cast<size_t>(batch.query_start[s + 1] - 1);
    track.hidden.assign(hidden.begin() + static_cast<std::ptrdiff_t>(last * width),
                        hidden.begin() + static_cast<std::ptrdiff_t>((last + 1) * width));
    track.logits.assign(logits.begin() + static_cast<std::ptrdiff_t>(s * vocab),
                        logits.begin() + static_cast<std::ptrdiff_t>((s + 1) * vocab));
  }
}

std::vector<MtpDrafter::Proposal> MtpDrafter::propose(const std::vector<Ask>& asks,
                                                      double confidence_floor) {
  const auto width = static_cast<size_t>(model_.config().hidden_size);
  const auto vocab = static_cast<size_t>(model_.config().vocab_size);
  std::vector<Proposal> proposals(asks.size());
  std::vector<std::unique_ptr<DraftSampler>> going;
  std::vector<Track*> tracks;
  std::vector<float> previous;  // each going sequence's latest module output
  for (size_t i = 0; i < asks.size(); ++i) {
    const Ask& ask = asks[i];
    auto found = tracks_.find(ask.owner);
    // The first draft is the module's prediction after the sequence's last token.
    if (ask.limit <= 0 || found == tracks_.end() ||
        found->second.next_position + 1 != static_cast<int64_t>(ask.tokens.size()))
      continue;
    Track& track = found->second;
    auto sampler = std::make_unique<DraftSampler>(ask, vocab_, proposals[i]);
    if (!sampler->draw(track.logits.data()) || sampler->confidence() < confidence_floor) continue;
    going.push_back(std::move(sampler));
    tracks.push_back(&track);
    previous.insert(previous.end(), track.hidden.begin(), track.hidden.end());
  }
  // Depth d + 1: the module on its own output at the previous position and draft d, written
  // into slots after the absorbed ones (the next absorb writes over them).
  for (int64_t depth = 1; !going.empty() && depth < max_chain_; ++depth) {
    ForwardBatch batch;
    for (size_t r = 0; r < going.size(); ++r) {
      Track& track = *tracks[r];
      batch.add_sequence({going[r]->proposal().tokens.back()}, track.absorbed + depth - 1, track.kv,
                         cache_.shape().block_size, false);
      batch.positions.back() = static_cast<int32_t>(track.next_position + depth - 1);
    }
    const auto started = std::chrono::steady_clock::now();
    std::vector<float> hidden, logits;
    run(batch, previous, hidden, logits);
    std::vector<std::unique_ptr<DraftSampler>> still;
    std::vector<Track*> still_tracks;
    std::vector<float> still_previous;
    for (size_t r = 0; r < going.size(); ++r) {
      DraftSampler& sampler = *going[r];
      if (!sampler.draw(logits.data() + r * vocab) || sampler.confidence() < confidence_floor)
        continue;
      still.push_back(std::move(going[r]));
      still_tracks.push_back(tracks[r]);
      still_previous.insert(still_previous.end(),
                            hidden.begin() + static_cast<std::ptrdiff_t>(r * width),
                            hidden.begin() + static_cast<std::ptrdiff_t>((r + 1) * width));
    }
    costs_.observe(
        batch.num_tokens(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    going = std::move(still);
    tracks = std::move(still_tracks);
    previous = std::move(still_previous);
  }
  return proposals;
}

}  // namespace deepinfer
