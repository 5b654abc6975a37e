// The serving engine's core loop: continuous batching over a paged, prefix-cached KV cache.
// Each step schedules decodes and prefill chunks under one token budget, runs one flattened
// forward, samples, and finishes or preempts requests. One thread drives it (step()); with
// async_scheduling the forward and sampling of step N run on a runner thread while that
// thread schedules step N+1 and reports step N-1's tokens.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/latency_histogram.h"
#include "engine/draft_model.h"
#include "engine/drafter.h"
#include "engine/mtp_drafter.h"
#include "engine/policies.h"
#include "engine/request.h"
#include "engine/step_runner.h"
#include "kv/kv_cache.h"
#include "kv/prefix_tiers.h"
#include "model/model.h"

namespace deepinfer {

struct EngineConfig {
  int block_size = 16;
  int64_t num_blocks = 0;  // KV blocks; 0: as many as the budget below holds
  // The KV budget when num_blocks is 0; 0 picks one by backend: 1 GiB of host memory on the
  // CPU, kDefaultDeviceKvFraction of the free device memory on a GPU (what vLLM users expect
  // from --gpu-memory-utilization).
  size_t kv_bytes = 0;
  double kv_memory_fraction = 0.0;  // > 0: that share of the available memory instead
  int max_batched_tokens = 2048;    // tokens per step: prefill chunks and decodes together
  int max_running = 64;             // sequences per step
  bool prefix_caching = true;
  // Schedule step N+1 while step N runs (results are the same as without).
  bool async_scheduling = false;
  // The prefix cache's disk tier (empty: none): full blocks of finished and preempted
  // sequences are written under this directory, which other engines may share, and prompts
  // look for their prefix there after memory.
  std::string kv_cache_dir;
  // The prefix cache's host-memory tier between the pool and the disk, in bytes (0: none):
  // what a GPU's pool lets go of is copied back from there instead of recomputed. On the CPU
  // backend the pool is host memory already (give it kv_bytes instead).
  size_t kv_host_bytes = 0;
  uint64_t kv_disk_bytes = 0;   // the directory's capacity for this model (0: unbounded)
  uint64_t kv_fingerprint = 0;  // model_fingerprint of the checkpoint and KV layout
  // Blocks waiting for the disk at most; more are dropped (counted), never waited for.
  size_t kv_disk_queue_blocks = 256;
  // Retention classes: how long blocks of a class stay on disk after their last use, in
  // seconds; requests name one (GenerationRequest::cache_retention) or get the default.
  // Without classes blocks stay until capacity needs the space.
  std::map<std::string, uint32_t> kv_retention_classes;
  std::string kv_retention_default;
  // Bounded replay for models with sliding-window layers beside full-attention ones: a prompt
  // whose prefix only the full-attention layers have cached (sliding windows' KV evicted, or
  // never stored below memory) recomputes that prefix's last swa_replay_tokens tokens through
  // every layer instead, and lower tiers then keep no sliding-window KV. kReplayDefault: the
  // model's window + 12 with a host or disk tier, off without; kReplayExact: as many tokens as make
  // the result the cold prefill's (CausalLM::replay_bounds); 0: off.
  int64_t swa_replay_tokens = kReplayDefault;
  static constexpr int64_t kReplayDefault = -1;
  static constexpr int64_t kReplayExact = -2;
  // Token ids at or above this are never sampled and refused in prompts and logit_bias: a
  // model's vocabulary is often padded past its tokenizer's (Qwen3: 151,936 rows for 151,669
  // tokens), and a padded id cannot be decoded. 0: the model's whole vocabulary.
  int32_t vocab_limit = 0;
  // Speculative decoding: requests (constrained ones too) verify drafted tokens in the same
  // forward as everything else and keep what the model itself would have drawn, so their
  // output is the same as without it, seeded sampling included.
  SpeculativeConfig speculative;
};

inline constexpr double kDefaultDeviceKvFraction = 0.9;

// The KV bytes `config` asks for (kv_bytes, or the fraction of the memory available now).
size_t kv_budget_bytes(const EngineConfig& config, const Ops& ops);

struct EngineStats {
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int64_t prefix_lookups = 0;
  int64_t prefix_hits = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;  // prompt tokens computed (prefix hits excluded)
  // Bounded replays (EngineConfig::swa_replay_tokens) and the cached tokens they recomputed.
  int64_t replays = 0;
  int64_t replayed_tokens = 0;
  int64_t generated_tokens = 0;
  // Speculative decoding: verifications of at least one draft, the draft tokens verified and
  // those kept, and how many were kept at each draft position (0: the first draft).
  int64_t drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_draft_tokens = 0;
  std::vector<int64_t> accepted_per_position;
  double seconds = 0.0;          // since the engine started, for tokens/s
  double host_seconds = 0.0;     // on the engine thread outside the forward: what overlap hides
  bool has_lower_tiers = false;  // a host-memory or disk tier below the pool
  PrefixTierStats tiers;         // with has_lower_tiers
  LatencyHistogram time_to_first_token;  // from submit() to the first sampled token
  LatencyHistogram inter_token_latency;  // between consecutive tokens of one completion
};

class Engine {
 public:
  Engine(CausalLM& model, const EngineConfig& config);
  ~Engine();

  // Admission: a request that can never fit (prompt + max_tokens beyond the model's context
  // or the whole cache) or has invalid sampling parameters is an Error here, not later.
  void submit(GenerationRequest request);
  // The limits submit() checks against; check_admission() with them is safe from any thread.
  const AdmissionLimits& admission_limits() const { return limits_; }
  // One scheduling step. Appends completions that finished to `finished` and, when given,
  // every token sampled to `tokens`; returns false when there was nothing to do.
  bool step(std::vector<GenerationResult>& finished, std::vector<TokenEvent>* tokens = nullptr);
  // Finishes a request early with FinishReason::kStop (a stop string matched, or the client
  // went away): completion `index`, or every completion when it is negative. Reported by the
  // next step(); unknown ids are ignored.
  void stop(const std::string& id, int index = -1);
  // Steps until every submitted request finished; results in completion order.
  std::vector<GenerationResult> run_to_completion();
  bool idle() const { return waiting_.empty() && running_.empty() && !in_flight_; }
  // Empties the prefix cache's memory tier: cached blocks no running request holds are
  // forgotten (lower tiers receive what they lack first, as on eviction, and keep theirs).
  // Returns the blocks forgotten.
  int64_t reset_prefix_cache();
  EngineStats stats() const;

 private:
  struct Sequence;
  struct Chunk;
  struct StepWork;
  std::unique_ptr<StepWork> plan_step();
  struct Planned;
  void add_chunk(StepWork& work, Sequence& sequence, int64_t count, Planned* plan = nullptr);
  void append_rows(StepWork& work, Chunk& chunk);
  // Async scheduling: moves `next`'s chunks back by the drafts the step before rejected
  // (`rejected`: per sequence) and chooses their deferred drafts. True when rows changed.
  bool settle_speculation(StepWork& next,
                          const std::unordered_map<const Sequence*, int64_t>& rejected);
  void settle_rows(StepWork& next, const std::unordered_map<const Sequence*, int64_t>& rejected);
  // How many draft tokens a decoding sequence could verify this step (0: it does not
  // speculate now).
  int64_t draft_limit(const Sequence& sequence, int64_t budget) const;
  // Gives planned decodes the drafts worth verifying this step (SpeculativeConfig::
  // verification), with their blocks, out of `budget` tokens.
  void choose_drafts(std::vector<Planned>& planned, int64_t& budget);
  // Runs the draft model for the planned decodes, up to `bounds` drafts each.
  void propose_with_model(std::vector<Planned>& planned, const std::vector<int64_t>& bounds,
                          std::vector<DraftOffer>& offers);
  // The model drafter's question for a sequence's next `limit` drafts.
  DraftAsk draft_ask(const Sequence& sequence, int64_t limit) const;
  // The drafts of chunks planned before their sequence's last token was known, now that it
  // is (as many as each planned at most): n-gram lookups or one call of the model drafter.
  std::vector<DraftProposal> draft_deferred(const std::vector<Chunk*>& chunks);
  double remaining_steps(const Sequence& sequence, double acceptance, int64_t limit) const;
  // How many of each offer's drafts to verify; `draft_costs`: the drafts are still to make.
  std::vector<int64_t> verify_lengths(const std::vector<Planned>& planned,
                                      const std::vector<DraftOffer>& offers, int64_t rows,
                                      int64_t tokens, const StepCosts* draft_costs) const;
  bool fixed_verification(const Sequence& sequence) const;
  void verify_drafts(Chunk& chunk, const float* rows) const;
  // The MTP module absorbs the positions a step computed (see MtpDrafter).
  void absorb_hidden(const StepWork& done);
  // The token at `position` given a draft drawn from `draft_distribution`: speculative
  // sampling's accept-or-resample draw from the model's distribution (see verify_draft).
  sampling::Sample sample_against(const Sequence& sequence, const structured::Matcher* matcher,
                                  const sampling::TokenHistory& history, const float* logits,
                                  uint64_t position, int32_t draft,
                                  std::span<const float> draft_distribution) const;
  void accept_verified(Chunk& chunk);
  // How the completion ends if `token` is its output number `count` (1-based); none: it goes on.
  std::optional<FinishReason> ending_after(const Sequence& sequence, int32_t token,
                                           size_t count) const;
  bool ensure_blocks(Sequence& sequence, int64_t tokens);
  void preempt_lowest(Sequence& needing);
  void admit_waiting(StepWork& work, int64_t& budget);
  bool prefix_loading(Sequence& sequence, std::vector<int32_t>& installed);
  void let_go(Sequence& sequence);
  uint32_t retention_seconds(const std::string& retention_class) const;
  // The tokens a bounded replay recomputes (0: none), from swa_replay_tokens and the model.
  int64_t replay_tokens(const CausalLM& model) const;
  bool may_admit(const Sequence& sequence) const;
  void execute(StepWork& work);
  void forward(StepWork& work, Tensor& logits);
  void sample_step(StepWork& work, Tensor& logits);
  Tensor step_logits(size_t rows);
  const float* host_logits(const Tensor& logits,
                           const std::vector<std::pair<size_t, size_t>>& ranges);
  // The token drawn from `logits` (a host row) under the matcher and history given (a
  // verification's, ahead of the sequence's own).
  sampling::Sample sample_under(const Sequence& sequence, const structured::Matcher* matcher,
                                const sampling::TokenHistory& history, const float* logits,
                                uint64_t position) const;
  sampling::Sample sample_masked(const Sequence& sequence, const structured::TokenMask& mask,
                                 const sampling::TokenHistory& history, const float* logits,
                                 uint64_t position) const;
  void apply_samples(StepWork& done, StepWork* next);
  void commit(StepWork& done, std::vector<GenerationResult>& finished,
              std::vector<TokenEvent>* tokens);
  void record_token(Sequence& sequence, const sampling::Sample& sample,
                    std::vector<GenerationResult>& finished, std::vector<TokenEvent>* tokens);
  void finish(Sequence& sequence, FinishReason reason, std::vector<GenerationResult>& finished);
  void finish_stopped(std::vector<GenerationResult>& finished);

  CausalLM& model_;
  EngineConfig config_;
  // A model drafter (a draft model or the MTP module), made before the KV cache takes its
  // share of the memory.
  std::unique_ptr<ModelDrafter> drafter_;
  MtpDrafter* mtp_ = nullptr;  // drafter_ when it is the MTP module
  // The step's final-norm hidden states [tokens, hidden] (host memory), for the MTP module.
  std::vector<float> step_hidden_;
  KvCache cache_;
  AdmissionLimits limits_;
  int32_t sampled_vocab_ = 0;  // ids below this can be sampled (EngineConfig::vocab_limit)
  int64_t replay_tokens_ = 0;  // a bounded replay's length (EngineConfig::swa_replay_tokens)
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  // Finished sequences that a launched step may still read; freed once it is done.
  std::vector<std::unique_ptr<Sequence>> retired_;
  std::unique_ptr<StepWork> in_flight_;
  BackendMemory logits_;       // the step's logits (see execute)
  BackendMemory host_logits_;  // rows of them sampled on the host
  size_t logits_floats_ = 0;
  std::unique_ptr<StepRunner> runner_;
  std::unique_ptr<StepRunner> mask_runner_;  // grammar masks beside the forward (execute)
  std::unique_ptr<PrefixTiers> tiers_;
  StepCosts step_costs_;        // forward time by step size, for SpeculativeConfig::verification
  AcceptanceModel acceptance_;  // the drafter's acceptance over every request
  uint64_t arrivals_ = 0;
  std::chrono::steady_clock::time_point started_;
  EngineStats stats_;
};

}  // namespace deepinfer
