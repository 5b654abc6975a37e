#include "engine/engine.h"

#include <algorithm>
#include <random>

#include "core/error.h"

namespace deepinfer {

struct Engine::Sequence {
  GenerationRequest request;
  uint64_t arrival = 0;
  uint64_t seed = 0;
  std::vector<int32_t> tokens;  // prompt, then generated
  std::vector<int32_t> generated;
  int64_t computed = 0;  // tokens whose K/V are in the cache
  SequenceBlocks blocks;
  sampling::TokenHistory history;
  int64_t cached_prompt_tokens = -1;  // set at first admission
  int preemptions = 0;
  bool stop_requested = false;
  std::chrono::steady_clock::time_point submitted, last_token;

  // Scheduling order: lower priority value first, then earlier arrival.
  bool before(const Sequence& other) const {
    return request.priority != other.request.priority ? request.priority < other.request.priority
                                                      : arrival < other.arrival;
  }
};

struct Engine::Plan {
  std::vector<std::pair<Sequence*, int64_t>> chunks;  // sequence, new tokens this step
};

void LatencyHistogram::observe(double seconds) {
  for (size_t i = 0; i < std::size(kBounds); ++i) {
    if (seconds <= kBounds[i]) ++cumulative[i];
  }
  ++cumulative.back();
  sum += seconds;
  ++count;
}

namespace {

int64_t blocks_for(int64_t tokens, int block_size) {
  return (tokens + block_size - 1) / block_size;
}

int64_t default_blocks(const CausalLM& model, const EngineConfig& config) {
  if (config.num_blocks > 0) return config.num_blocks;
  size_t per_block = model.kv_shape(config.block_size).bytes_per_block();
  return std::max<int64_t>(2, static_cast<int64_t>(config.kv_bytes / per_block));
}

}  // namespace

Engine::Engine(CausalLM& model, const EngineConfig& config)
    : model_(model),
      config_(config),
      cache_(model.kv_shape(config.block_size), default_blocks(model, config)) {
  DI_CHECK(config.max_batched_tokens > 0 && config.max_running > 0,
           "engine: max_batched_tokens and max_running must be positive");
  const std::vector<int>& windows = model.config().layer_window;
  bool all_sliding = !windows.empty() && std::all_of(windows.begin(), windows.end(),
                                                     [](int window) { return window > 0; });
  if (all_sliding) widest_window_ = *std::max_element(windows.begin(), windows.end());
  // Arrival numbers start at a random point: unseeded requests derive their seed from theirs.
  std::random_device device;
  arrivals_ = (uint64_t{device()} << 20) ^ device();
}

Engine::~Engine() = default;

void Engine::submit(GenerationRequest request) {
  const ModelConfig& c = model_.config();
  if (request.prompt.empty()) fail("request {}: the prompt is empty", request.id);
  for (int32_t token : request.prompt) {
    if (token < 0 || token >= c.vocab_size)
      fail("request {}: token id {} is outside the vocabulary (size {})", request.id, token,
           c.vocab_size);
  }
  if (request.max_tokens < 1) fail("request {}: max_tokens must be at least 1", request.id);
  int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (total > c.max_position_embeddings) {
    fail("request {}: {} prompt tokens + {} max_tokens exceed the model's context length of {}",
         request.id, request.prompt.size(), request.max_tokens, c.max_position_embeddings);
  }
  int64_t usable = cache_.num_blocks() - 1;
  if (blocks_for(total, config_.block_size) > usable) {
    fail("request {}: {} tokens need {} KV blocks but the cache has {}", request.id, total,
         blocks_for(total, config_.block_size), usable);
  }
  sampling::validate(request.sampling, c.vocab_size);
  auto sequence = std::make_unique<Sequence>();
  sequence->arrival = ++arrivals_;
  sequence->seed = request.sampling.seed.value_or(sequence->arrival * 0x9e3779b97f4a7c15ull);
  sequence->tokens = request.prompt;
  sequence->history.add_prompt(request.prompt);
  sequence->submitted = std::chrono::steady_clock::now();
  sequence->request = std::move(request);
  waiting_.push_back(std::move(sequence));
}

// Grows a sequence's blocks to `tokens`, preempting lower-priority running sequences while the
// pool is short. False when `sequence` itself had to go.
bool Engine::ensure_blocks(Sequence& sequence, int64_t tokens) {
  while (!sequence.blocks.try_reserve(cache_, tokens)) {
    preempt_lowest(&sequence);
    bool still_running = std::any_of(running_.begin(), running_.end(),
                                     [&](const auto& s) { return s.get() == &sequence; });
    if (!still_running) return false;
  }
  return true;
}

// Frees the running sequence that comes last in scheduling order (it is recomputed later, its
// output so far kept), or `keep` itself when nothing else can give blocks back.
void Engine::preempt_lowest(const Sequence* keep) {
  auto victim = running_.end();
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->get() == keep) continue;
    if (victim == running_.end() || (*victim)->before(**it)) victim = it;
  }
  if (victim == running_.end() || (*victim)->before(*keep)) {
    victim = std::find_if(running_.begin(), running_.end(),
                          [&](const auto& s) { return s.get() == keep; });
  }
  std::unique_ptr<Sequence> sequence = std::move(*victim);
  running_.erase(victim);
  sequence->blocks.release_all(cache_);
  sequence->computed = 0;
  ++sequence->preemptions;
  ++stats_.preemptions;
  waiting_.push_front(std::move(sequence));
}

void Engine::admit_waiting(Plan& plan, int64_t& budget) {
  std::stable_sort(waiting_.begin(), waiting_.end(),
                   [](const auto& a, const auto& b) { return a->before(*b); });
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < config_.max_running) {
    Sequence& sequence = *waiting_.front();
    if (config_.prefix_caching && sequence.computed == 0) {
      sequence.computed =
          sequence.blocks.take_cached_prefix(cache_, sequence.tokens, sequence.request.cache_salt);
    }
    if (sequence.cached_prompt_tokens < 0) sequence.cached_prompt_tokens = sequence.computed;
    int64_t chunk =
        std::min<int64_t>(budget, static_cast<int64_t>(sequence.tokens.size()) - sequence.computed);
    if (!sequence.blocks.try_reserve(cache_, sequence.computed + chunk)) {
      // Waiting requests never preempt running ones; try again when blocks come back.
      sequence.blocks.release_all(cache_);
      sequence.computed = 0;
      break;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    plan.chunks.emplace_back(running_.back().get(), chunk);
    budget -= chunk;
  }
}

bool Engine::schedule(Plan& plan) {
  int64_t budget = config_.max_batched_tokens;
  std::stable_sort(running_.begin(), running_.end(),
                   [](const auto& a, const auto& b) { return a->before(*b); });
  // Preemption only ever removes the sequence at hand or ones after it in this order, so the
  // planned ones keep their positions.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* sequence = running_[i].get();
    int64_t chunk = std::min<int64_t>(
        budget, static_cast<int64_t>(sequence->tokens.size()) - sequence->computed);
    if (!ensure_blocks(*sequence, sequence->computed + chunk)) continue;  // it was preempted
    plan.chunks.emplace_back(sequence, chunk);
    budget -= chunk;
    ++i;
  }
  admit_waiting(plan, budget);
  return !plan.chunks.empty();
}

void Engine::finish(Sequence& sequence, FinishReason reason,
                    std::vector<GenerationResult>& finished) {
  GenerationResult result;
  result.id = sequence.request.id;
  result.tokens = sequence.generated;
  result.finish_reason = reason;
  result.prompt_tokens = static_cast<int64_t>(sequence.request.prompt.size());
  result.cached_prompt_tokens = std::max<int64_t>(0, sequence.cached_prompt_tokens);
  result.preemptions = sequence.preemptions;
  finished.push_back(std::move(result));
  sequence.blocks.release_all(cache_);
}

void Engine::stop(const std::string& id) {
  for (auto& sequence : running_)
    if (sequence->request.id == id) sequence->stop_requested = true;
  for (auto& sequence : waiting_)
    if (sequence->request.id == id) sequence->stop_requested = true;
}

void Engine::finish_stopped(std::vector<GenerationResult>& finished) {
  auto finish_from = [&](auto& queue) {
    for (auto it = queue.begin(); it != queue.end();) {
      if ((*it)->stop_requested) {
        finish(**it, FinishReason::kStop, finished);
        it = queue.erase(it);
      } else {
        ++it;
      }
    }
  };
  finish_from(running_);
  finish_from(waiting_);
}

bool Engine::step(std::vector<GenerationResult>& finished, std::vector<SampledToken>* sampled_out) {
  size_t already = finished.size();
  finish_stopped(finished);
  Plan plan;
  if (!schedule(plan)) return finished.size() > already;
  ++stats_.steps;
  const int block_size = config_.block_size;
  ForwardBatch batch;
  std::vector<Sequence*> sampled;
  for (auto [sequence, chunk] : plan.chunks) {
    auto begin = sequence->tokens.begin() + sequence->computed;
    bool reaches_end = sequence->computed + chunk == static_cast<int64_t>(sequence->tokens.size());
    batch.add_sequence(std::vector<int32_t>(begin, begin + chunk), sequence->computed,
                       sequence->blocks, block_size, false, reaches_end);
    if (reaches_end) sampled.push_back(sequence);
  }
  int64_t vocab = model_.config().vocab_size;
  std::vector<float> logits(sampled.size() * static_cast<size_t>(vocab));
  model_.forward(batch, cache_, logits.data());
  for (auto [sequence, chunk] : plan.chunks) {
    sequence->computed += chunk;
    if (config_.prefix_caching) {
      sequence->blocks.publish_full_blocks(cache_, sequence->tokens, sequence->computed,
                                           sequence->request.cache_salt);
    }
    // The next query sits at `computed`; keys before its window are never read again.
    if (widest_window_ > 0)
      sequence->blocks.release_before(cache_, sequence->computed - widest_window_ + 1);
  }
  const ModelConfig& c = model_.config();
  for (size_t i = 0; i < sampled.size(); ++i) {
    Sequence& sequence = *sampled[i];
    const GenerationRequest& request = sequence.request;
    sampling::Sample draw = sampling::sample(logits.data() + i * static_cast<size_t>(vocab),
                                             c.vocab_size, request.sampling, sequence.history,
                                             sequence.seed, sequence.generated.size());
    sequence.generated.push_back(draw.token);
    sequence.tokens.push_back(draw.token);
    sequence.history.add_output(draw.token);
    ++stats_.generated_tokens;
    if (sampled_out) sampled_out->push_back({request.id, draw.token});
    auto now = std::chrono::steady_clock::now();
    if (sequence.generated.size() == 1) {
      stats_.time_to_first_token.observe(
          std::chrono::duration<double>(now - sequence.submitted).count());
    } else {
      stats_.inter_token_latency.observe(
          std::chrono::duration<double>(now - sequence.last_token).count());
    }
    sequence.last_token = now;
    bool may_stop = static_cast<int>(sequence.generated.size()) >= request.min_tokens;
    bool is_eos = !request.ignore_eos && std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(),
                                                   draw.token) != c.eos_token_ids.end();
    bool is_stop = std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(),
                             draw.token) != request.stop_token_ids.end();
    std::optional<FinishReason> reason;
    if (may_stop && (is_eos || is_stop)) reason = FinishReason::kStop;
    if (!reason && static_cast<int>(sequence.generated.size()) >= request.max_tokens)
      reason = FinishReason::kLength;
    if (!reason) continue;
    finish(sequence, *reason, finished);
    running_.erase(std::find_if(running_.begin(), running_.end(),
                                [&](const auto& s) { return s.get() == &sequence; }));
  }
  return true;
}

std::vector<GenerationResult> Engine::run_to_completion() {
  std::vector<GenerationResult> finished;
  while (step(finished)) {
  }
  DI_CHECK(waiting_.empty() && running_.empty(), "engine: stalled with {} waiting requests",
           waiting_.size());
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
  return stats;
}

}  // namespace deepinfer
