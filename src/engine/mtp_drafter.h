// Speculative decoding's MTP drafter (SpeculativeConfig::method "mtp"): the target's own
// multi-token-prediction module (DeepSeek's num_nextn_predict_layers) drafts from the
// target's hidden states. After every step the module absorbs the positions the step
// computed (the target's final-norm output at position i beside token i + 1) into its own
// one-layer cache; its output at a sequence's last position gives the first draft, and the
// module run again on its own output gives the next ones (one module chained, as vLLM drafts
// more tokens than a checkpoint has modules).
#pragma once

#include <unordered_map>
#include <vector>

#include "engine/model_drafter.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace deepinfer {

class MtpDrafter final : public ModelDrafter {
 public:
  // `vocab`: the ids the target samples; `num_blocks` blocks of `block_size` tokens for the
  // module's cache; a sequence drafts `max_chain` tokens at most.
  MtpDrafter(CausalLM& model, int32_t vocab, int block_size, int64_t num_blocks, int64_t max_chain);

  // Positions one step computed for a sequence: the target's final-norm output for each
  // ([count, hidden], host memory); the tokens after them must be known.
  struct Rows {
    const void* owner = nullptr;
    std::span<const int32_t> tokens;  // the sequence's tokens
    int64_t start = 0;
    int64_t count = 0;
    const float* hidden = nullptr;
  };
  // Absorbs every sequence's rows in one forward of the module.
  void absorb(const std::vector<Rows>& rows);

  // A sequence gets drafts once the module has absorbed its last token.
  std::vector<Proposal> propose(const std::vector<Ask>& asks, double confidence_floor) override;
  int64_t catch_up(const void* /*owner*/, std::span<const int32_t> /*tokens*/) const override {
    return 1;
  }
  void forget(const void* owner) override;
  const StepCosts& costs() const override { return costs_; }
  double kv_bytes_per_token() const override {
    return static_cast<double>(cache_.shape().bytes_per_block()) / cache_.shape().block_size;
  }

 private:
  struct Track {
    SequenceKv kv;
    int64_t absorbed = 0;       // rows in the module's cache (its own slots, in order)
    int64_t next_position = 0;  // the position after the last absorbed one
    std::vector<float> hidden;  // the module's output at the last absorbed position
    std::vector<float> logits;  // and its logits: the first draft
  };
  // One forward of the module over `batch`, whose rows' previous states are `previous`.
  void run(const ForwardBatch& batch, const std::vector<float>& previous,
           std::vector<float>& hidden, std::vector<float>& logits);

  CausalLM& model_;
  int32_t vocab_;
  int64_t max_chain_;  // drafts a sequence chains at most (slots kept past its absorbed ones)
  KvCache cache_;
  std::unordered_map<const void*, Track> tracks_;
  StepCosts costs_;
};

}  // namespace deepinfer
