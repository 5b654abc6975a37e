#include "engine/sequence_runner.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

namespace {

// Every cache group keeps every block here; one more is the pool's null block.
int64_t blocks_for(const KvCacheShape& shape, int64_t max_tokens) {
  return 1 + shape.groups().num_groups() *
                 std::max<int64_t>(1, (max_tokens + shape.block_size - 1) / shape.block_size);
}

}  // namespace

SequenceRunner::SequenceRunner(CausalLM& model, int64_t max_tokens, int block_size)
    : model_(model),
      cache_(model.kv_shape(block_size), blocks_for(model.kv_shape(block_size), max_tokens),
             model.ops()),
      capacity_(max_tokens) {}

ForwardBatch SequenceRunner::next_batch(const std::vector<int32_t>& tokens, bool all_logits) {
  DI_CHECK(!tokens.empty(), "no tokens to run");
  int64_t needed = length_ + static_cast<int64_t>(tokens.size());
  DI_CHECK(needed <= capacity_, "sequence of {} tokens exceeds the {} this run was sized for",
           needed, capacity_);
  blocks_.reserve(cache_, needed);
  ForwardBatch batch;
  batch.add_sequence(tokens, length_, blocks_, cache_.shape().block_size, all_logits);
  return batch;
}

std::vector<float> SequenceRunner::feed(const std::vector<int32_t>& tokens, bool all_logits,
                                        const HiddenStateSink& hidden_sink) {
  ForwardBatch batch = next_batch(tokens, all_logits);
  int64_t vocab = model_.config().vocab_size;
  std::vector<float> logits(batch.logit_rows.size() * static_cast<size_t>(vocab));
  model_.forward(batch, cache_, logits.data(), hidden_sink);
  length_ += static_cast<int64_t>(tokens.size());
  return logits;
}

int32_t SequenceRunner::feed_greedy(int32_t token) {
  ForwardBatch batch = next_batch({token}, false);
  if (last_logits_.data() == nullptr)
    last_logits_ = BackendTensor(model_.ops(), {1, model_.config().vocab_size});
  Tensor logits = last_logits_.view();
  model_.forward_into(batch, cache_, logits);
  TokenDraw greedy;
  greedy.with_logprob = false;
  DrawnToken drawn;
  model_.ops().sample_rows(logits, {greedy}, &drawn);
  length_ += 1;
  return drawn.token;
}

int32_t argmax(const float* values, int64_t count) {
  return static_cast<int32_t>(std::max_element(values, values + count) - values);
}

std::vector<int32_t> generate(CausalLM& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options) {
  const ModelConfig& config = model.config();
  sampling::validate(options.sampling, config.vocab_size);
  int64_t limit = static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  SequenceRunner runner(model, limit);
  sampling::TokenHistory history;
  history.add_prompt(prompt);
  uint64_t seed = options.sampling.seed.value_or(options.seed);
  std::vector<int32_t> generated;
  std::vector<float> logits = runner.feed(prompt, false);
  while (static_cast<int>(generated.size()) < options.max_new_tokens) {
    int32_t next = sampling::sample(logits.data(), config.vocab_size, options.sampling, history,
                                    seed, generated.size())
                       .token;
    generated.push_back(next);
    history.add_output(next);
    bool is_eos = std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), next) !=
                  config.eos_token_ids.end();
    if ((options.stop_at_eos && is_eos) ||
        static_cast<int>(generated.size()) == options.max_new_tokens)
      break;
    logits = runner.feed({next}, false);
  }
  return generated;
}

std::vector<int32_t> generate_greedy(CausalLM& model, const std::vector<int32_t>& prompt,
                                     const GreedyOptions& options) {
  GenerateOptions generate_options;
  generate_options.max_new_tokens = options.max_new_tokens;
  generate_options.stop_at_eos = options.stop_at_eos;
  generate_options.sampling.temperature = 0.0f;
  return generate(model, prompt, generate_options);
}

}  // namespace deepinfer
