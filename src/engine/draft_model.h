// Speculative decoding's draft model (SpeculativeConfig::method "draft_model"): a smaller
// model sharing the target's vocabulary proposes each sequence's next tokens, one forward per
// draft position with every drafting sequence in the batch. Sampled requests draw their
// drafts from the draft's distribution under their own sampling parameters (the engine's
// rejection sampling needs it); greedy ones take its most likely token.
//
// The draft keeps its own paged KV per sequence. Between calls it follows the sequence by
// comparison: the tokens it computed that still match the sequence's (accepted drafts
// included) stay, positions after them are written over.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/model_drafter.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace deepinfer {

class DraftModel final : public ModelDrafter {
 public:
  // `vocab`: the ids the target samples from (the draft's vocabulary holds at least those);
  // `num_blocks` KV blocks of `block_size` tokens (the model may round the size up).
  DraftModel(std::unique_ptr<CausalLM> model, int32_t vocab, int block_size, int64_t num_blocks);

  const CausalLM& model() const { return *model_; }
  int64_t num_blocks() const { return cache_.num_blocks(); }

  // A sequence gets no drafts when the draft's cache is full.
  std::vector<Proposal> propose(const std::vector<Ask>& asks, double confidence_floor) override;
  // Those after the longest prefix of `tokens` its cache holds, and the last one always.
  int64_t catch_up(const void* owner, std::span<const int32_t> tokens) const override;
  void forget(const void* owner) override;
  const StepCosts& costs() const override { return costs_; }
  double kv_bytes_per_token() const override {
    return static_cast<double>(cache_.shape().bytes_per_block()) / cache_.shape().block_size;
  }

 private:
  struct Track {
    SequenceKv kv;
    std::vector<int32_t> written;  // tokens whose K/V the draft's cache holds
    int64_t confirmed = 0;         // of them, known to match the sequence
  };
  // Queues the tokens of `ask` its track has not computed; false when the cache is full.
  bool queue_catch_up(const Ask& ask, Track& track, ForwardBatch& batch);
  // The tokens at the start of `tokens` that `track` holds (from its confirmed ones on).
  static int64_t matching(const Track& track, std::span<const int32_t> tokens);
  std::vector<float> run(const ForwardBatch& batch);

  std::unique_ptr<CausalLM> model_;
  int32_t vocab_;
  KvCache cache_;
  std::unordered_map<const void*, Track> tracks_;
  // A forward's time (with its draws) by its token count, profiled up to this many at start.
  static constexpr int64_t kProfiledRows = 64;
  StepCosts costs_;
};

}  // namespace deepinfer
