#include "engine/policies.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

void check_admission(const GenerationRequest& request, const AdmissionLimits& limits) {
  if (request.prompt.empty()) fail("request {}: the prompt is empty", request.id);
  for (int32_t token : request.prompt) {
    if (token < 0 || token >= limits.vocab_size)
      fail("request {}: token id {} is outside the vocabulary (size {})", request.id, token,
           limits.vocab_size);
  }
  if (request.max_tokens < 1) fail("request {}: max_tokens must be at least 1", request.id);
  if (request.min_tokens < 0 || request.min_tokens > request.max_tokens)
    fail("request {}: min_tokens must be in [0, max_tokens={}], got {}", request.id,
         request.max_tokens, request.min_tokens);
  int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (total > limits.max_context) {
    fail("request {}: {} prompt tokens + {} max_tokens exceed the model's context length of {}",
         request.id, request.prompt.size(), request.max_tokens, limits.max_context);
  }
  int64_t blocks = limits.peak_blocks(total);
  if (blocks > limits.usable_blocks) {
    fail("request {}: {} tokens need {} KV blocks but the cache has {}", request.id, total, blocks,
         limits.usable_blocks);
  }
  sampling::validate(request.sampling, limits.vocab_size);
  const std::vector<std::string>& classes = limits.retention_classes;
  if (!request.cache_retention.empty() && !classes.empty() &&
      std::find(classes.begin(), classes.end(), request.cache_retention) == classes.end()) {
    fail("request {}: cache_retention '{}' is not a retention class (the classes: {})", request.id,
         request.cache_retention, fmt::join(classes, ", "));
  }
}

int64_t AdmissionLimits::peak_blocks(int64_t tokens) const {
  auto blocks = [&](int64_t count) { return (count + block_size - 1) / block_size; };
  int64_t total = 0;
  for (int window : group_windows) {
    // A block boundary can split both ends of the span, hence the extra block.
    total +=
        window > 0 ? std::min(blocks(tokens), blocks(window - 1 + max_chunk) + 1) : blocks(tokens);
  }
  return total;
}

size_t choose_preemption_victim(std::span<const QueueKey> running, size_t needing) {
  size_t victim = needing;
  for (size_t i = 0; i < running.size(); ++i) {
    if (i != needing && running[victim].runs_before(running[i])) victim = i;
  }
  return victim;
}

}  // namespace deepinfer
