// What goes into the engine and what comes out of it: token ids and typed parameters only
// (text, templates and JSON stay with the caller).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sampling/sampling.h"
#include "structured/structured.h"

namespace deepinfer {

struct GenerationRequest {
  std::string id;
  std::vector<int32_t> prompt;
  sampling::SamplingParams sampling;  // includes n, logprobs and prompt_logprobs
  int max_tokens = 16;
  int min_tokens = 0;  // eos and stop tokens are ignored before this many
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  uint64_t cache_salt = 0;  // requests only share cached blocks with the same salt
  // The retention class its blocks are kept on disk under (EngineConfig::kv_retention_classes;
  // empty: the default class).
  std::string cache_retention;
  int priority = 0;  // lower runs first and is preempted last (FCFS among equals)
  // When set, every completion's output follows it (masked sampling); logprobs still
  // describe the model's own distribution.
  std::shared_ptr<const structured::Constraint> constraint;
};

enum class FinishReason { kStop, kLength };

// One finished completion (a request with n > 1 ends with n of them, index 0..n-1).
struct GenerationResult {
  std::string id;
  int index = 0;
  std::vector<int32_t> tokens;
  FinishReason finish_reason = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int preemptions = 0;
  // One entry per output token when sampling.logprobs is set.
  std::vector<sampling::Sample> logprobs;
  // With sampling.prompt_logprobs >= 0 (index 0 only): one entry per prompt token after the
  // first, each token's logprob given the tokens before it.
  std::vector<sampling::Sample> prompt_logprobs;
};

// A token sampled in one step, for streaming and stop strings.
struct TokenEvent {
  std::string id;
  int index = 0;
  int32_t token = 0;
  sampling::Sample logprob;  // filled when the request asked for logprobs
};

}  // namespace deepinfer
