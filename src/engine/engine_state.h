// The engine's per-request and per-step state, shared by its source files (engine.cpp, the
// scheduler and model runner; engine_speculation.cpp, drafts and their verification).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "engine/engine.h"

namespace deepinfer {

// A request with n completions runs as n sequences; they share the request's id.
struct Engine::Sequence {
  GenerationRequest request;
  int index = 0;
  QueueKey key;
  uint64_t seed = 0;
  std::vector<int32_t> tokens;  // prompt, then generated (sampled ones only, see pending)
  std::vector<int32_t> generated;
  // Output tokens reported so far (speculation appends several to `generated` at once).
  size_t recorded = 0;
  // Speculation: its drafts' acceptance so far (the chance of the next, see AcceptanceModel).
  AcceptanceTrials acceptance;
  std::vector<sampling::Sample> logprobs, prompt_logprobs;
  // Tokens whose K/V are written, or being written by a launched step.
  int64_t computed = 0;
  // Tokens that launched steps sample for this sequence and that are not in `tokens` yet (two
  // when step N+1 was planned before step N's token arrived).
  int pending = 0;
  // Drafts a launched step verifies, counted as accepted until its verdict arrives: step N+1
  // is planned on that assumption and moved back by the drafts rejected (apply_samples).
  int64_t speculated = 0;
  // Bumped by preemption: a launched step of an older epoch no longer owns the blocks.
  uint64_t epoch = 0;
  SequenceKv blocks;
  sampling::TokenHistory history;
  std::unique_ptr<structured::Matcher> matcher;  // the request's constraint, if any
  int64_t cached_prompt_tokens = -1;             // set at first admission
  // The prefix's blocks below memory: a fetch in flight (its ticket), or looked for already.
  uint64_t fetch = 0;
  bool fetched = false;
  int preemptions = 0;
  bool stop_requested = false;
  bool finished = false;
  // Siblings (n > 1) wait for the first completion's prompt to be cached, then share it.
  std::shared_ptr<bool> prompt_cached;
  std::chrono::steady_clock::time_point submitted, last_token;

  int64_t prompt_size() const { return static_cast<int64_t>(request.prompt.size()); }
  int64_t length() const { return static_cast<int64_t>(tokens.size()) + pending + speculated; }
  // Output tokens so far, counting those of launched steps as length() does.
  int64_t outputs() const { return static_cast<int64_t>(generated.size()) + pending + speculated; }
  bool wants_prompt_logprobs() const {
    return request.sampling.prompt_logprobs >= 0 && index == 0 &&
           static_cast<int64_t>(prompt_logprobs.size()) < prompt_size() - 1;
  }
};

// Tokens of one sequence in one step, and what comes back for them.
struct Engine::Chunk {
  Sequence* sequence = nullptr;
  int64_t start = 0;  // position of the first token
  int64_t count = 0;
  uint64_t epoch = 0;
  size_t first_row = 0;  // of the batch
  size_t first_logit_row = 0;
  size_t logit_rows = 0;
  bool samples = false;      // the chunk ends at the sequence's end: its last row is sampled
  bool prompt_rows = false;  // every row's logits are kept for prompt logprobs
  uint64_t output_position = 0;
  sampling::Sample sample;
  // The grammar's mask for the sampled row (free without one), made beside the forward.
  structured::TokenMask mask;
  std::vector<sampling::Sample> prompt_scores;  // for prompt positions start+1 ...
  // Speculation: the drafts after the sequence's last token (their rows follow its row), the
  // model's own tokens for them up to the first that differs (see verify_drafts), and how
  // many positions' KV that leaves valid.
  std::vector<int32_t> drafts;
  // n-gram drafts to choose once the sequence's last token arrives (async scheduling plans this
  // step before it): `drafts` holds their number until then.
  bool drafts_deferred = false;
  // The distribution each draft was drawn from, for sampled requests with a draft model;
  // empty: each draft is one token for sure.
  std::vector<std::vector<float>> draft_distributions;
  std::vector<sampling::Sample> verified;
  int64_t kept = 0;
};

struct Engine::StepWork {
  ForwardBatch batch;
  std::vector<Chunk> chunks;
  // Decode inputs that the step before samples: batch row and sequence.
  std::vector<std::pair<size_t, Sequence*>> placeholders;
  // How long its forward and sampling took on the runner thread (async scheduling).
  double seconds = 0.0;
};

// A decode planned for this step, and the drafts it verifies.
struct Engine::Planned {
  Sequence* sequence = nullptr;
  int64_t count = 0;
  std::vector<int32_t> drafts;
  std::vector<std::vector<float>> draft_distributions;
  bool drafts_deferred = false;
};

}  // namespace deepinfer
