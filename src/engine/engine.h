// The serving engine's core loop: continuous batching over a paged, prefix-cached KV cache.
// Each step schedules decodes and prefill chunks under one token budget, runs one flattened
// forward, samples, and finishes or preempts requests. One thread drives it (step()).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "sampling/sampling.h"

namespace deepinfer {

struct EngineConfig {
  int block_size = 16;
  int64_t num_blocks = 0;             // KV blocks; 0: as many as kv_bytes holds
  size_t kv_bytes = size_t{1} << 30;  // the KV budget when num_blocks is 0
  int max_batched_tokens = 2048;      // tokens per step: prefill chunks and decodes together
  int max_running = 64;               // sequences per step
  bool prefix_caching = true;
};

struct GenerationRequest {
  std::string id;
  std::vector<int32_t> prompt;
  sampling::SamplingParams sampling;
  int max_tokens = 16;
  int min_tokens = 0;  // eos and stop tokens are ignored before this many
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  uint64_t cache_salt = 0;  // requests only share cached blocks with the same salt
  int priority = 0;         // lower runs first and is preempted last (FCFS among equals)
};

enum class FinishReason { kStop, kLength };

struct GenerationResult {
  std::string id;
  std::vector<int32_t> tokens;
  FinishReason finish_reason = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int preemptions = 0;
};

// Counts of observations at or below each bound (seconds), Prometheus-style; the last bucket
// is +Inf. sum and count as Prometheus histograms report them.
struct LatencyHistogram {
  static constexpr double kBounds[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
                                       0.5,   1.0,   2.5,  5.0,   10.0, 30.0, 60.0};
  std::vector<int64_t> cumulative = std::vector<int64_t>(std::size(kBounds) + 1, 0);
  double sum = 0.0;
  int64_t count = 0;
  void observe(double seconds);
};

struct EngineStats {
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int64_t prefix_lookups = 0;
  int64_t prefix_hits = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t generated_tokens = 0;
  LatencyHistogram time_to_first_token;  // from submit() to the first sampled token
  LatencyHistogram inter_token_latency;  // between consecutive tokens of one request
};

class Engine {
 public:
  Engine(CausalLM& model, const EngineConfig& config);
  ~Engine();

  // Admission: a request that can never fit (prompt + max_tokens beyond the model's context
  // or the whole cache) or has invalid sampling parameters is an Error here, not later.
  void submit(GenerationRequest request);
  // One scheduling step. Appends requests that finished in it to `finished` and, when given,
  // every token sampled in it to `sampled` (for streaming and stop strings); returns false
  // when there was nothing to do.
  struct SampledToken {
    std::string id;
    int32_t token;
  };
  bool step(std::vector<GenerationResult>& finished, std::vector<SampledToken>* sampled = nullptr);
  // Finishes a request early with FinishReason::kStop (a stop string matched, or the client
  // went away); it is reported by the next step(). Unknown ids are ignored.
  void stop(const std::string& id);
  // Steps until every submitted request finished; results in completion order.
  std::vector<GenerationResult> run_to_completion();
  EngineStats stats() const;

 private:
  struct Sequence;
  struct Plan;
  bool schedule(Plan& plan);
  bool ensure_blocks(Sequence& sequence, int64_t tokens);
  void preempt_lowest(const Sequence* keep);
  void admit_waiting(Plan& plan, int64_t& budget);
  void finish(Sequence& sequence, FinishReason reason, std::vector<GenerationResult>& finished);
  void finish_stopped(std::vector<GenerationResult>& finished);

  CausalLM& model_;
  EngineConfig config_;
  // Tokens a query still attends to when every layer has a sliding window (0: some layer sees
  // everything, so no block is ever freed early).
  int64_t widest_window_ = 0;
  KvCache cache_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  uint64_t arrivals_ = 0;
  EngineStats stats_;
};

}  // namespace deepinfer
