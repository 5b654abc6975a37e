// The scheduler's policies as small pure functions: which requests may enter at all
// (admission), in what order sequences run, and which one gives its KV blocks back when the
// cache runs short (preemption).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/request.h"

namespace deepinfer {

// What a request is checked against before it is queued.
struct AdmissionLimits {
  int32_t vocab_size = 0;
  int64_t max_context = 0;    // the model's context length
  int64_t usable_blocks = 0;  // KV blocks one sequence could ever hold (all but the null block)
  int block_size = 16;
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
