#include "engine/engine.h"

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "engine/engine_state.h"
#include "engine/mtp_drafter.h"

namespace deepinfer {

namespace {

double bytes_per_token(const KvCacheShape& shape) {
  return static_cast<double>(shape.bytes_per_block()) / shape.block_size;
}

// Tokens the KV budget holds. A drafter's cache (`drafter_bytes` a token) holds as many tokens
// as the target's, so the budget pays for both.
int64_t kv_token_capacity(const CausalLM& model, double drafter_bytes, const EngineConfig& config) {
  const int block_size = model.kv_shape(config.block_size).block_size;
  if (config.num_blocks > 0) return config.num_blocks * block_size;
  const double per_token = bytes_per_token(model.kv_shape(config.block_size)) + drafter_bytes;
  const auto budget = static_cast<double>(kv_budget_bytes(config, model.ops()));
  return std::max<int64_t>(2 * block_size, static_cast<int64_t>(budget / per_token));
}

// The KV bytes a token takes in the drafter's cache (0: no model drafter).
double drafter_bytes_per_token(const CausalLM& model, const CausalLM* draft,
                               const EngineConfig& config) {
  if (draft) return bytes_per_token(draft->kv_shape(config.block_size));
  if (config.speculative.method == "mtp")
    return bytes_per_token(model.mtp_kv_shape(config.block_size));
  return 0.0;
}

// SpeculativeConfig::method "draft_model" (the draft, in the target's backend) or "mtp" (the
// target's own module), with a cache for as many tokens as the target's plus a partly filled
// block per running sequence.
std::unique_ptr<ModelDrafter> make_drafter(CausalLM& model, const EngineConfig& config) {
  const SpeculativeConfig& speculative = config.speculative;
  if (speculative.method != "draft_model" && speculative.method != "mtp") return nullptr;
  speculative.validate();
  std::unique_ptr<CausalLM> draft;
  if (speculative.method == "draft_model") {
    try {
      draft = load_model(speculative.model, ModelLoadOptions{}, model.ops());
    } catch (const Error& error) {
      fail("the speculative draft model {}: {}", speculative.model, error.what());
    }
  } else if (model.num_mtp_modules() == 0) {
    fail(
        "speculative method 'mtp': {} has no multi-token-prediction modules "
        "(num_nextn_predict_layers)",
        model.config().architecture);
  }
  const int32_t vocab = config.vocab_limit > 0 ? config.vocab_limit : model.config().vocab_size;
  const int64_t tokens =
      kv_token_capacity(model, drafter_bytes_per_token(model, draft.get(), config), config);
  const KvCacheShape shape =
      draft ? draft->kv_shape(config.block_size) : model.mtp_kv_shape(config.block_size);
  const int64_t blocks = tokens / shape.block_size + config.max_running + 1;
  if (draft)
    return std::make_unique<DraftModel>(std::move(draft), vocab, config.block_size, blocks);
  return std::make_unique<MtpDrafter>(model, vocab, config.block_size, blocks,
                                      speculative.num_speculative_tokens);
}

int64_t default_blocks(const CausalLM& model, const ModelDrafter* drafter,
                       const EngineConfig& config) {
  if (config.num_blocks > 0) return config.num_blocks;
  return kv_token_capacity(model, drafter ? drafter->kv_bytes_per_token() : 0.0, config) /
         model.kv_shape(config.block_size).block_size;
}

double seconds_between(std::chrono::steady_clock::time_point from,
                       std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

size_t kv_budget_bytes(const EngineConfig& config, const Ops& ops) {
  double fraction = config.kv_memory_fraction;
  if (fraction <= 0.0 && config.kv_bytes > 0) return config.kv_bytes;
  if (fraction <= 0.0 && ops.device() == Device::kCpu) return size_t{1} << 30;
  if (fraction <= 0.0) fraction = kDefaultDeviceKvFraction;
  DI_CHECK(fraction < 1.0, "engine: the KV memory fraction must be in (0, 1)");
  return static_cast<size_t>(static_cast<double>(ops.available_memory()) * fraction);
}

Engine::Engine(CausalLM& model, const EngineConfig& config)
    : model_(model),
      config_(config),
      drafter_(make_drafter(model, config)),
      cache_(model.kv_shape(config.block_size), default_blocks(model, drafter_.get(), config),
             model.ops()),
      started_(std::chrono::steady_clock::now()) {
  DI_CHECK(config.max_batched_tokens > 0 && config.max_running > 0,
           "engine: max_batched_tokens and max_running must be positive");
  const ModelConfig& c = model.config();
  DI_CHECK(config.vocab_limit >= 0 && config.vocab_limit <= c.vocab_size,
           "engine: vocab_limit {} is outside the model's vocabulary of {}", config.vocab_limit,
           c.vocab_size);
  sampled_vocab_ = config.vocab_limit > 0 ? config.vocab_limit : c.vocab_size;
  // A model may need larger blocks than asked for (DeepSeek-V4: whole compression windows).
  config_.block_size = cache_.shape().block_size;
  limits_ = {sampled_vocab_,
             c.max_position_embeddings,
             cache_.num_blocks() - 1,
             config_.block_size,
             cache_.groups().group_window,
             config.max_batched_tokens,
             {}};
  for (const auto& [name, seconds] : config.kv_retention_classes)
    limits_.retention_classes.push_back(name);
  DI_CHECK(config.kv_retention_default.empty() ||
               config.kv_retention_classes.count(config.kv_retention_default),
           "engine: the default retention class '{}' is not one of the classes",
           config.kv_retention_default);
  // On the CPU the forward uses every core: a thread spinning beside it would slow it down.
  if (config.async_scheduling)
    runner_ = std::make_unique<StepRunner>(model_.ops().device() != Device::kCpu);
  mtp_ = dynamic_cast<MtpDrafter*>(drafter_.get());
  config.speculative.validate();
  // Adaptive verification weighs a step's size against its time: known before the first step.
  if (config.speculative.enabled() && config.speculative.verification == "adaptive")
    profile_forward_costs(model, cache_, std::min(config.max_batched_tokens, 512), step_costs_);
  replay_tokens_ = replay_tokens(model);
  if (!config.kv_cache_dir.empty() || config.kv_host_bytes > 0) {
    PrefixTierOptions tiers;
    tiers.host_bytes = config.kv_host_bytes;
    if (!config.kv_cache_dir.empty()) {
      DI_CHECK(config.kv_fingerprint != 0,
               "engine: a KV cache directory needs the model's fingerprint");
      DiskTierOptions& disk = tiers.disk.emplace();
      disk.dir = config.kv_cache_dir;
      disk.fingerprint = config.kv_fingerprint;
      disk.capacity_bytes = config.kv_disk_bytes;
      disk.queue_limit = config.kv_disk_queue_blocks;
    }
    tiers.evicted_retention_seconds = retention_seconds(config.kv_retention_default);
    tiers.keep_windows = replay_tokens_ == 0;
    tiers_ = std::make_unique<PrefixTiers>(cache_, std::move(tiers));
  }
  // Arrival numbers start at a random point: unseeded requests derive their seed from theirs.
  std::random_device device;
  arrivals_ = (uint64_t{device()} << 20) ^ device();
}

Engine::~Engine() {
  if (runner_) runner_->wait();
}

void Engine::submit(GenerationRequest request) {
  check_admission(request, limits_);
  auto now = std::chrono::steady_clock::now();
  auto prompt_cached = std::make_shared<bool>(false);
  uint64_t arrival = ++arrivals_;
  uint64_t base_seed = request.sampling.seed.value_or(arrival * 0x9e3779b97f4a7c15ull);
  for (int index = 0; index < request.sampling.n; ++index) {
    auto sequence = std::make_unique<Sequence>();
    sequence->index = index;
    sequence->key = {request.priority, arrival};
    sequence->seed = sampling::completion_seed(base_seed, index);
    sequence->tokens = request.prompt;
    sequence->history.add_prompt(request.prompt);
    sequence->prompt_cached = prompt_cached;
    sequence->submitted = now;
    sequence->request = request;
    if (request.constraint) sequence->matcher = request.constraint->start();
    waiting_.push_back(std::move(sequence));
  }
}

// Grows a sequence's blocks to `tokens`, preempting lower-priority running sequences while the
// pool is short. False when `sequence` itself had to go.
bool Engine::ensure_blocks(Sequence& sequence, int64_t tokens) {
  while (!sequence.blocks.try_reserve(cache_, tokens)) {
    preempt_lowest(sequence);
    bool still_running = std::any_of(running_.begin(), running_.end(),
                                     [&](const auto& s) { return s.get() == &sequence; });
    if (!still_running) return false;
  }
  return true;
}

// The victim is recomputed later with its output so far kept; a step already launched for
// it still delivers its token (its KV writes land in blocks nobody reads before then).
void Engine::preempt_lowest(Sequence& needing) {
  std::vector<QueueKey> keys;
  size_t needing_index = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    keys.push_back(running_[i]->key);
    if (running_[i].get() == &needing) needing_index = i;
  }
  auto victim =
      running_.begin() + static_cast<std::ptrdiff_t>(choose_preemption_victim(keys, needing_index));
  std::unique_ptr<Sequence> sequence = std::move(*victim);
  running_.erase(victim);
  let_go(*sequence);
  sequence->computed = 0;
  sequence->fetched = false;  // its blocks may be on disk only by the time it returns
  ++sequence->epoch;
  ++sequence->preemptions;
  ++stats_.preemptions;
  waiting_.push_front(std::move(sequence));
}

bool Engine::may_admit(const Sequence& sequence) const {
  if (sequence.pending > 0) return false;  // its token from a launched step is still coming
  return sequence.index == 0 || !config_.prefix_caching || *sequence.prompt_cached;
}

void Engine::admit_waiting(StepWork& work, int64_t& budget) {
  std::stable_sort(waiting_.begin(), waiting_.end(),
                   [](const auto& a, const auto& b) { return a->key.runs_before(b->key); });
  for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0 &&
                                   static_cast<int>(running_.size()) < config_.max_running;) {
    Sequence& sequence = **it;
    if (!may_admit(sequence)) {
      ++it;
      continue;
    }
    // Prompt logprobs need every prompt row's logits, so such a prompt is computed in full.
    std::vector<int32_t> installed;
    if (config_.prefix_caching && sequence.computed == 0 && !sequence.wants_prompt_logprobs()) {
      if (prefix_loading(sequence, installed)) {
        ++it;
        continue;
      }
      sequence.computed = sequence.blocks.take_cached_prefix(
          cache_, sequence.tokens, sequence.request.cache_salt, replay_tokens_);
      if (sequence.blocks.replay().restored_end > 0) {
        stats_.replayed_tokens += sequence.blocks.replay().restored_end - sequence.computed;
        ++stats_.replays;
      }
      for (int32_t block : installed) cache_.release(block);  // taken above, or evictable now
    }
    if (sequence.cached_prompt_tokens < 0) sequence.cached_prompt_tokens = sequence.computed;
    int64_t chunk = std::min<int64_t>(budget, sequence.length() - sequence.computed);
    if (!sequence.blocks.try_reserve(cache_, sequence.computed + chunk)) {
      // Waiting requests never preempt running ones; try again when blocks come back.
      sequence.blocks.release_all(cache_);
      sequence.computed = 0;
      break;
    }
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
    add_chunk(work, *running_.back(), chunk);
    budget -= chunk;
  }
}

// Whether `sequence` waits for its prefix's blocks from the disk tier: the first time it is
// admitted a fetch starts (if memory lacks some of them); once it is ready its blocks go into
// the pool (`installed`, referenced until the caller has taken its prefix) and it may run.
bool Engine::prefix_loading(Sequence& sequence, std::vector<int32_t>& installed) {
  if (!tiers_ || sequence.fetched) return false;
  if (sequence.fetch == 0) {
    sequence.fetch = tiers_->start_fetch(sequence.tokens, sequence.request.cache_salt);
    if (sequence.fetch == 0) {
      sequence.fetched = true;
      return false;
    }
  }
  if (!tiers_->ready(sequence.fetch)) return true;
  installed = tiers_->install(sequence.fetch);
  sequence.fetch = 0;
  sequence.fetched = true;
  return false;
}

// A sequence gives its blocks back (finished or preempted); what it published goes to the
// disk tier first, so a later prompt finds it there once memory has reused the blocks.
void Engine::let_go(Sequence& sequence) {
  if (tiers_ && config_.prefix_caching && !sequence.blocks.empty())
    tiers_->offload(sequence.blocks, sequence.tokens,
                    retention_seconds(sequence.request.cache_retention));
  sequence.blocks.release_all(cache_);
  if (drafter_) drafter_->forget(&sequence);
}

int64_t Engine::reset_prefix_cache() {
  return cache_.pool().forget_idle();
}

int64_t Engine::replay_tokens(const CausalLM& model) const {
  const CausalLM::ReplayBounds bounds = model.replay_bounds();
  int64_t tokens = config_.swa_replay_tokens;
  DI_CHECK(tokens >= EngineConfig::kReplayExact,
           "engine: swa_replay_tokens {} is neither a token count nor exact", tokens);
  // Layers that all slide keep their windows: there is nothing a replay could start from.
  if (bounds.exact == 0 || !has_full_attention_group(cache_.groups())) return 0;
  if (tokens == EngineConfig::kReplayDefault)
    tokens = config_.kv_cache_dir.empty() && config_.kv_host_bytes == 0 ? 0 : bounds.window + 12;
  if (tokens == EngineConfig::kReplayExact) tokens = bounds.exact;
  return tokens == 0 ? 0 : std::max(tokens, bounds.least);
}

uint32_t Engine::retention_seconds(const std::string& retention_class) const {
  auto found = config_.kv_retention_classes.find(
      retention_class.empty() ? config_.kv_retention_default : retention_class);
  return found == config_.kv_retention_classes.end() ? 0 : found->second;
}

void Engine::add_chunk(StepWork& work, Sequence& sequence, int64_t count, Planned* plan) {
  Chunk chunk;
  if (plan) {
    chunk.drafts = std::move(plan->drafts);
    chunk.draft_distributions = std::move(plan->draft_distributions);
    chunk.drafts_deferred = plan->drafts_deferred;
  }
  const auto drafts = static_cast<int64_t>(chunk.drafts.size());
  chunk.sequence = &sequence;
  chunk.start = sequence.computed;
  chunk.count = count + drafts;
  chunk.epoch = sequence.epoch;
  chunk.samples = chunk.start + count == sequence.length();
  chunk.prompt_rows = sequence.wants_prompt_logprobs() && chunk.start < sequence.prompt_size() - 1;
  chunk.output_position = static_cast<uint64_t>(sequence.outputs());
  append_rows(work, chunk);
  sequence.computed += chunk.count;
  sequence.speculated += drafts;
  if (chunk.samples) ++sequence.pending;
  work.chunks.push_back(std::move(chunk));
}

// The chunk's rows at the end of the batch: its known tokens, placeholders for the one a
// launched step samples, then its drafts.
void Engine::append_rows(StepWork& work, Chunk& chunk) {
  const Sequence& sequence = *chunk.sequence;
  const int64_t count = chunk.count - static_cast<int64_t>(chunk.drafts.size());
  chunk.first_logit_row = work.batch.logit_rows.size();
  chunk.first_row = work.batch.tokens.size();
  std::vector<int32_t> input(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    int64_t position = chunk.start + i;
    if (position < static_cast<int64_t>(sequence.tokens.size())) {
      input[static_cast<size_t>(i)] = sequence.tokens[static_cast<size_t>(position)];
    } else {
      work.placeholders.emplace_back(work.batch.tokens.size() + static_cast<size_t>(i),
                                     chunk.sequence);
    }
  }
  input.insert(input.end(), chunk.drafts.begin(), chunk.drafts.end());
  work.batch.add_sequence(input, chunk.start, sequence.blocks, config_.block_size,
                          chunk.prompt_rows || !chunk.drafts.empty(),
                          chunk.samples || chunk.prompt_rows);
  chunk.logit_rows = work.batch.logit_rows.size() - chunk.first_logit_row;
}

std::unique_ptr<Engine::StepWork> Engine::plan_step() {
  auto work = std::make_unique<StepWork>();
  int64_t budget = config_.max_batched_tokens;
  std::vector<Planned> planned;
  std::stable_sort(running_.begin(), running_.end(),
                   [](const auto& a, const auto& b) { return a->key.runs_before(b->key); });
  // Preemption only ever removes the sequence at hand or ones after it in this order, so the
  // planned ones keep their positions.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& sequence = *running_[i];
    bool last_token_pending = sequence.outputs() >= sequence.request.max_tokens;
    int64_t count = std::min<int64_t>(budget, sequence.length() - sequence.computed);
    if (last_token_pending || count == 0) {
      ++i;
      continue;
    }
    // With async scheduling the step in flight commits after this plan: keys its sliding
    // layers no longer read go back now, or a tight pool could not grow the sequence. Drafts
    // in flight may be rejected: the next query may sit that much earlier. (A forward ends
    // before the next one can write to a block freed here.)
    sequence.blocks.release_out_of_window(cache_, sequence.computed - sequence.speculated);
    if (!ensure_blocks(sequence, sequence.computed + count)) continue;  // it was preempted
    planned.push_back({&sequence, count, {}, {}, false});
    budget -= count;
    ++i;
  }
  choose_drafts(planned, budget);
  for (Planned& plan : planned) add_chunk(*work, *plan.sequence, plan.count, &plan);
  admit_waiting(*work, budget);
  if (work->chunks.empty()) return nullptr;
  return work;
}

// Appends the tokens `done` sampled, and writes them into the decode rows of `next` that were
// planned before they were known.
void Engine::apply_samples(StepWork& done, StepWork* next) {
  std::unordered_map<const Sequence*, int64_t> rejected;  // drafts `next` assumed accepted
  for (Chunk& chunk : done.chunks) {
    Sequence& sequence = *chunk.sequence;
    if (!chunk.samples || sequence.finished) continue;
    if (!chunk.drafts.empty()) {
      accept_verified(chunk);
      rejected[&sequence] = chunk.count - chunk.kept;
      continue;
    }
    --sequence.pending;
    // A token the mask allowed always fits; one that does not (every token masked) ends it.
    if (sequence.matcher && !sequence.matcher->accept(chunk.sample.token))
      sequence.stop_requested = true;
    sequence.tokens.push_back(chunk.sample.token);
    sequence.generated.push_back(chunk.sample.token);
    sequence.history.add_output(chunk.sample.token);
  }
  // Before any drafting for `next`: the MTP module drafts from what `done` computed.
  if (mtp_) absorb_hidden(done);
  if (next) settle_rows(*next, rejected);
}

// Before `next` launches: its chunks settled (settle_speculation), their rows rebuilt if that
// changed them, and the decode inputs sampled by the step before written in.
void Engine::settle_rows(StepWork& next,
                         const std::unordered_map<const Sequence*, int64_t>& rejected) {
  if (settle_speculation(next, rejected)) {
    next.batch = ForwardBatch{};
    next.placeholders.clear();
    for (Chunk& chunk : next.chunks) append_rows(next, chunk);
  }
  for (auto [row, sequence] : next.placeholders) {
    auto position = static_cast<size_t>(next.batch.positions[row]);
    // A sequence that ended in `done` may have stopped short of the row: it is not read.
    next.batch.tokens[row] = position < sequence->tokens.size() ? sequence->tokens[position] : 0;
  }
}

void Engine::commit(StepWork& done, std::vector<GenerationResult>& finished,
                    std::vector<TokenEvent>* tokens) {
  ++stats_.steps;
  for (Chunk& chunk : done.chunks) {
    Sequence& sequence = *chunk.sequence;
    if (sequence.finished) continue;
    // A speculating chunk keeps the KV of its verified tokens only; the rest is written over.
    int64_t end = chunk.start + (chunk.drafts.empty() ? chunk.count : chunk.kept);
    stats_.prompt_tokens += std::max<int64_t>(
        0, std::min(end, sequence.prompt_size()) - std::max(chunk.start, int64_t{0}));
    if (chunk.epoch == sequence.epoch) {
      if (config_.prefix_caching) {
        sequence.blocks.publish_full_blocks(cache_, sequence.tokens, end,
                                            sequence.request.cache_salt);
      }
      // The next query sits at `end`; keys before a sliding layer's window are never read
      // by it again.
      sequence.blocks.release_out_of_window(cache_, end);
    }
    if (end >= sequence.prompt_size()) *sequence.prompt_cached = true;
    // Only scores that extend the recorded ones count (a recomputed prefix repeats them).
    for (size_t i = 0; i < chunk.prompt_scores.size(); ++i) {
      if (chunk.start + static_cast<int64_t>(i) ==
          static_cast<int64_t>(sequence.prompt_logprobs.size()))
        sequence.prompt_logprobs.push_back(std::move(chunk.prompt_scores[i]));
    }
    if (!chunk.drafts.empty()) {
      ++stats_.drafts;
      stats_.draft_tokens += static_cast<int64_t>(chunk.drafts.size());
      stats_.accepted_draft_tokens += chunk.kept - 1;
      std::vector<int64_t>& per_position = stats_.accepted_per_position;
      per_position.resize(std::max(per_position.size(), chunk.drafts.size()));
      for (int64_t i = 0; i + 1 < chunk.kept; ++i) ++per_position[static_cast<size_t>(i)];
      for (const sampling::Sample& sample : chunk.verified) {
        if (sequence.finished) break;
        record_token(sequence, sample, finished, tokens);
      }
    } else if (chunk.samples) {
      record_token(sequence, chunk.sample, finished, tokens);
    }
  }
}

void Engine::record_token(Sequence& sequence, const sampling::Sample& sample,
                          std::vector<GenerationResult>& finished,
                          std::vector<TokenEvent>* tokens) {
  const GenerationRequest& request = sequence.request;
  if (request.sampling.logprobs) sequence.logprobs.push_back(sample);
  ++sequence.recorded;
  ++stats_.generated_tokens;
  if (tokens) tokens->push_back({request.id, sequence.index, sample.token, sample});
  auto now = std::chrono::steady_clock::now();
  if (sequence.recorded == 1) {
    stats_.time_to_first_token.observe(seconds_between(sequence.submitted, now));
  } else {
    stats_.inter_token_latency.observe(seconds_between(sequence.last_token, now));
  }
  sequence.last_token = now;
  if (std::optional<FinishReason> reason = ending_after(sequence, sample.token, sequence.recorded))
    finish(sequence, *reason, finished);
}

std::optional<FinishReason> Engine::ending_after(const Sequence& sequence, int32_t token,
                                                 size_t count) const {
  const GenerationRequest& request = sequence.request;
  const std::vector<int32_t>& eos = model_.config().eos_token_ids;
  bool may_stop = static_cast<int>(count) >= request.min_tokens;
  bool is_eos = !request.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end();
  bool is_stop = std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(), token) !=
                 request.stop_token_ids.end();
  if (may_stop && (is_eos || is_stop)) return FinishReason::kStop;
  if (static_cast<int>(count) >= request.max_tokens) return FinishReason::kLength;
  return std::nullopt;
}

// Reports the completion and moves the sequence to retired_: a launched step may still hold
// a pointer to it. Its blocks go back now (nothing reads them once the launched step ends).
void Engine::finish(Sequence& sequence, FinishReason reason,
                    std::vector<GenerationResult>& finished) {
  GenerationResult result;
  result.id = sequence.request.id;
  result.index = sequence.index;
  result.tokens = sequence.generated;
  result.finish_reason = reason;
  result.prompt_tokens = sequence.prompt_size();
  result.cached_prompt_tokens = std::max<int64_t>(0, sequence.cached_prompt_tokens);
  result.preemptions = sequence.preemptions;
  result.logprobs = std::move(sequence.logprobs);
  result.prompt_logprobs = std::move(sequence.prompt_logprobs);
  finished.push_back(std::move(result));
  let_go(sequence);
  if (tiers_ && sequence.fetch != 0) tiers_->cancel(sequence.fetch);
  sequence.fetch = 0;
  sequence.finished = true;
  *sequence.prompt_cached = true;  // siblings must not wait for a prompt that stopped early
  auto take = [&](auto& queue) {
    auto it = std::find_if(queue.begin(), queue.end(),
                           [&](const auto& s) { return s.get() == &sequence; });
    if (it == queue.end()) return false;
    retired_.push_back(std::move(*it));
    queue.erase(it);
    return true;
  };
  if (!take(running_)) take(waiting_);
}

void Engine::stop(const std::string& id, int index) {
  auto mark = [&](auto& queue) {
    for (auto& sequence : queue) {
      if (sequence->request.id == id && (index < 0 || sequence->index == index))
        sequence->stop_requested = true;
    }
  };
  mark(running_);
  mark(waiting_);
}

void Engine::finish_stopped(std::vector<GenerationResult>& finished) {
  std::vector<Sequence*> stopped;
  for (auto& sequence : running_)
    if (sequence->stop_requested) stopped.push_back(sequence.get());
  for (auto& sequence : waiting_)
    if (sequence->stop_requested) stopped.push_back(sequence.get());
  for (Sequence* sequence : stopped) finish(*sequence, FinishReason::kStop, finished);
}

// Plain loop: plan, run, commit. Overlapped: plan N+1 while N runs, wait for N, hand its
// tokens to N+1 and launch it, then commit N while N+1 runs.
bool Engine::step(std::vector<GenerationResult>& finished, std::vector<TokenEvent>* tokens) {
  auto host_start = std::chrono::steady_clock::now();
  double forward_seconds = 0.0;  // the plain loop's forward, which is not host work
  size_t already = finished.size();
  finish_stopped(finished);
  std::unique_ptr<StepWork> next = plan_step();
  std::unique_ptr<StepWork> done = std::move(in_flight_);
  if (done) {
    auto wait_start = std::chrono::steady_clock::now();
    runner_->wait();
    forward_seconds += seconds_between(wait_start, std::chrono::steady_clock::now());
    step_costs_.observe(done->batch.num_tokens(), done->seconds);
    apply_samples(*done, next.get());
  } else if (next && runner_) {
    settle_rows(*next, {});
  }
  // Sequences retired before `next` was planned are in no step still running after this.
  std::vector<std::unique_ptr<Sequence>> released = std::move(retired_);
  if (next && runner_) {
    in_flight_ = std::move(next);
    runner_->start([this, work = in_flight_.get()] {
      const auto start = std::chrono::steady_clock::now();
      execute(*work);
      work->seconds = seconds_between(start, std::chrono::steady_clock::now());
    });
  } else if (next) {
    auto forward_start = std::chrono::steady_clock::now();
    execute(*next);
    const double seconds = seconds_between(forward_start, std::chrono::steady_clock::now());
    forward_seconds += seconds;
    step_costs_.observe(next->batch.num_tokens(), seconds);
    apply_samples(*next, nullptr);
    done = std::move(next);
  }
  if (done) commit(*done, finished, tokens);
  stats_.host_seconds +=
      seconds_between(host_start, std::chrono::steady_clock::now()) - forward_seconds;
  if (done || in_flight_ || finished.size() > already) return true;
  // Nothing ran: requests wait only for their prefixes from the disk tier.
  if (!tiers_ || !tiers_->fetching()) return false;
  tiers_->wait(std::chrono::milliseconds(5));
  return true;
}

std::vector<GenerationResult> Engine::run_to_completion() {
  std::vector<GenerationResult> finished;
  while (step(finished)) {
  }
  DI_CHECK(idle(), "engine: stalled with {} waiting requests", waiting_.size());
  return finished;
}

EngineStats Engine::stats() const {
  EngineStats stats = stats_;
  stats.waiting = static_cast<int64_t>(waiting_.size());
  stats.running = static_cast<int64_t>(running_.size());
  stats.kv_blocks_total = cache_.num_blocks() - 1;
  stats.kv_blocks_used = stats.kv_blocks_total - cache_.free_blocks();
  stats.prefix_lookups = cache_.pool().lookups();
  stats.prefix_hits = cache_.pool().hits();
  stats.seconds = seconds_between(started_, std::chrono::steady_clock::now());
  stats.has_lower_tiers = tiers_ != nullptr;
  if (tiers_) stats.tiers = tiers_->stats();
  return stats;
}

}  // namespace deepinfer
