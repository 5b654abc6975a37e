// The scheduler's policies as small pure functions: which requests may enter at all
// (admission), in what order sequences run, and which one gives its KV blocks back when the
// cache runs short (preemption).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/request.h"

namespace deepinfer {

// What a request is checked against before it is queued.
struct AdmissionLimits {
  int32_t vocab_size = 0;
  int64_t max_context = 0;    // the model's context length
  int64_t usable_blocks = 0;  // KV blocks in the pool (all but the null block)
  int block_size = 16;
  std::vector<int> group_windows = {0};  // per KV cache group: 0 full, else its window
  int64_t max_chunk = 2048;              // the most tokens one step adds to a sequence
  // The retention classes a request may name (none configured: any name, to no effect).
  std::vector<std::string> retention_classes = {};

  // The most blocks a sequence of `tokens` tokens holds at once over all cache groups: a
  // full group all of them, a sliding group its window plus one step's chunk.
  int64_t peak_blocks(int64_t tokens) const;
};

// Throws Error with a clear message when `request` can never run: empty prompt, ids outside
// the vocabulary, max_tokens < 1, prompt + max_tokens beyond the context or the whole cache,
// invalid sampling parameters.
void check_admission(const GenerationRequest& request, const AdmissionLimits& limits);

// A sequence's place in line: lower priority values first, then earlier arrivals (FCFS).
struct QueueKey {
  int priority = 0;
  uint64_t arrival = 0;
  bool runs_before(const QueueKey& other) const {
    return priority != other.priority ? priority < other.priority : arrival < other.arrival;
  }
};

// Which of the running sequences (`running`, any order) gives its blocks back so that
// running[needing] can grow: the one that runs last, or `needing` itself when every other
// sequence runs before it.
size_t choose_preemption_victim(std::span<const QueueKey> running, size_t needing);

}  // namespace deepinfer
