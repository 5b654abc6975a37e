// Runs one sequence through a model with its own paged KV cache: the building block of the
// logits command, single-prompt generate and the model benchmark.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "sampling/sampling.h"

namespace deepinfer {

class SequenceRunner {
 public:
  // Sizes the cache for `max_tokens` tokens in blocks of `block_size`.
  SequenceRunner(CausalLM& model, int64_t max_tokens, int block_size = 16);

  // Feeds `tokens` after what the sequence already holds. Returns logits for every new token
  // ([count, vocab], row-major) when `all_logits`, else only for the last one.
  std::vector<float> feed(const std::vector<int32_t>& tokens, bool all_logits,
                          const HiddenStateSink& hidden_sink = nullptr);
  // Feeds one token and returns the greedy next one, drawn where the logits are (on a GPU only
  // the token comes back, as in the engine).
  int32_t feed_greedy(int32_t token);
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }

 private:
  CausalLM& model_;
  KvCache cache_;
  // The batch that feeds `tokens` after the cached ones, blocks reserved for them.
  ForwardBatch next_batch(const std::vector<int32_t>& tokens, bool all_logits);

  SequenceKv blocks_;
  int64_t length_ = 0;
  int64_t capacity_;
  BackendTensor last_logits_;  // feed_greedy's [1, vocab], made on first use
};

struct GreedyOptions {
  int max_new_tokens = 16;
  bool stop_at_eos = true;
};

struct GenerateOptions {
  int max_new_tokens = 16;
  bool stop_at_eos = true;
  sampling::SamplingParams sampling;  // temperature 0: greedy
  uint64_t seed = 0;                  // the draw seed (sampling.seed when given)
};

// Continuation of `prompt` sampled as `options` says (one sequence, without the batching
// engine): the new token ids.
std::vector<int32_t> generate(CausalLM& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options);

// Greedy continuation of `prompt` (temperature 0): the new token ids.
std::vector<int32_t> generate_greedy(CausalLM& model, const std::vector<int32_t>& prompt,
                                     const GreedyOptions& options);

int32_t argmax(const float* values, int64_t count);

}  // namespace deepinfer
