// Speculative decoding inside the engine's step: which decodes verify drafts and how many,
// and what their verification keeps (see SpeculativeConfig).
#include <algorithm>
#include <optional>

#include "engine/engine_state.h"

namespace deepinfer {

// Every decoding request may speculate (its output follows the model's distribution either
// way, see verify_drafts). Drafts stop short of max_tokens and the context length. With async
// scheduling a decode's last token is usually still in flight when its next step is planned:
// the step then holds rows for the drafts, which are made when the token arrives, between
// the two forwards (settle_speculation; a model drafter's forward has the backend to itself).
int64_t Engine::draft_limit(const Sequence& sequence, int64_t budget) const {
  const SpeculativeConfig& speculative = config_.speculative;
  if (!speculative.enabled()) return 0;
  if (sequence.pending == 0 &&
      sequence.computed + 1 != static_cast<int64_t>(sequence.tokens.size()))
    return 0;
  return std::max<int64_t>(
      0, std::min<int64_t>({speculative.num_speculative_tokens, budget,
                            sequence.request.max_tokens - sequence.outputs() - 1,
                            model_.config().max_position_embeddings - sequence.length()}));
}

void Engine::choose_drafts(std::vector<Planned>& planned, int64_t& budget) {
  const SpeculativeConfig& speculative = config_.speculative;
  if (!speculative.enabled()) return;
  std::vector<DraftOffer> offers(planned.size());
  int64_t rows = 0, tokens = 0;
  for (size_t i = 0; i < planned.size(); ++i) {
    Planned& plan = planned[i];
    tokens += plan.count;
    const Sequence& sequence = *plan.sequence;
    if (plan.count == 1 || sequence.computed + plan.count == sequence.length()) ++rows;
    const int64_t limit = plan.count == 1 ? draft_limit(sequence, budget) : 0;
    // A deferred draft's count comes from a lookup over the tokens known now: the one in
    // flight rarely changes whether the context repeats.
    plan.drafts_deferred = !drafter_ && sequence.pending > 0;
    if (!drafter_ && limit > 0)
      plan.drafts = ngram_drafts(sequence.tokens, speculative.prompt_lookup_min,
                                 speculative.prompt_lookup_max, limit);
    offers[i] = {drafter_ ? limit : static_cast<int64_t>(plan.drafts.size()),
                 acceptance_.chance(sequence.acceptance),
                 {},
                 1};
    if (drafter_ && limit > 0) {
      offers[i].catch_up = drafter_->catch_up(&sequence, sequence.tokens);
      offers[i].catch_up_steps = std::min(remaining_steps(sequence, offers[i].acceptance, limit),
                                          1.0 + acceptance_.evidence());
    }
  }
  std::vector<int64_t> taken;
  if (drafter_) {
    // Drafting costs time of its own: the draft model runs only as far as verifying pays (its
    // drafting, cut short by its confidence, is not second-guessed once paid for). With async
    // scheduling a step may be running now: the step keeps rows for the drafts, made just
    // before it launches.
    const std::vector<int64_t> bounds =
        verify_lengths(planned, offers, rows, tokens, &drafter_->costs());
    if (!runner_) propose_with_model(planned, bounds, offers);
    for (size_t i = 0; i < planned.size(); ++i) {
      if (runner_ && bounds[i] > 0) {
        planned[i].drafts.assign(static_cast<size_t>(bounds[i]), 0);
        planned[i].drafts_deferred = true;
      }
      taken.push_back(runner_ ? bounds[i] : offers[i].proposed);
    }
  } else {
    taken = verify_lengths(planned, offers, rows, tokens, nullptr);
  }
  for (size_t i = 0; i < planned.size(); ++i) {
    Planned& plan = planned[i];
    const int64_t count = std::min(taken[i], budget);
    // A draft is never worth a preemption: its blocks come from free ones only.
    if (count <= 0 ||
        !plan.sequence->blocks.try_reserve(cache_, plan.sequence->computed + 1 + count)) {
      plan.drafts.clear();
      plan.draft_distributions.clear();
      plan.drafts_deferred = false;
      continue;
    }
    plan.drafts.resize(static_cast<size_t>(count));
    if (!plan.draft_distributions.empty())
      plan.draft_distributions.resize(static_cast<size_t>(count));
    budget -= count;
  }
}

// The steps a sequence has left when each verifies `limit` drafts that are accepted with
// chance `acceptance` each, given the ones before.
double Engine::remaining_steps(const Sequence& sequence, double acceptance, int64_t limit) const {
  const int64_t remaining =
      std::min<int64_t>(sequence.request.max_tokens - sequence.outputs(),
                        model_.config().max_position_embeddings - sequence.length());
  double per_step = 1.0, chain = 1.0;
  for (int64_t k = 0; k < limit; ++k) per_step += chain *= acceptance;
  return static_cast<double>(std::max<int64_t>(remaining, 1)) / per_step;
}

void Engine::propose_with_model(std::vector<Planned>& planned, const std::vector<int64_t>& bounds,
                                std::vector<DraftOffer>& offers) {
  std::vector<ModelDrafter::Ask> asks;
  std::vector<size_t> asking;
  for (size_t i = 0; i < planned.size(); ++i) {
    offers[i].proposed = 0;
    if (bounds[i] <= 0) continue;
    asks.push_back(draft_ask(*planned[i].sequence, bounds[i]));
    asking.push_back(i);
  }
  if (asks.empty()) return;
  std::vector<ModelDrafter::Proposal> proposals =
      drafter_->propose(asks, config_.speculative.confidence_threshold);
  for (size_t j = 0; j < asking.size(); ++j) {
    Planned& plan = planned[asking[j]];
    ModelDrafter::Proposal& proposal = proposals[j];
    offers[asking[j]].proposed = static_cast<int64_t>(proposal.tokens.size());
    offers[asking[j]].chances = std::move(proposal.confidence);
    plan.drafts = std::move(proposal.tokens);
    plan.draft_distributions = std::move(proposal.distributions);
  }
}

DraftAsk Engine::draft_ask(const Sequence& sequence, int64_t limit) const {
  DraftAsk ask;
  ask.owner = &sequence;
  ask.tokens = sequence.tokens;
  ask.limit = limit;
  ask.params = &sequence.request.sampling;
  ask.history = &sequence.history;
  ask.matcher = sequence.matcher.get();
  ask.seed = sequence.seed;
  ask.position = sequence.generated.size();
  return ask;
}

std::vector<int64_t> Engine::verify_lengths(const std::vector<Planned>& planned,
                                            const std::vector<DraftOffer>& offers, int64_t rows,
                                            int64_t tokens, const StepCosts* draft_costs) const {
  std::vector<int64_t> lengths(offers.size());
  for (size_t i = 0; i < offers.size(); ++i) lengths[i] = offers[i].proposed;
  if (config_.speculative.verification != "adaptive" || !step_costs_.known()) return lengths;
  const std::vector<int64_t> adaptive =
      verified_drafts(offers, rows, tokens, step_costs_, draft_costs);
  for (size_t i = 0; i < offers.size(); ++i)
    if (!fixed_verification(*planned[i].sequence)) lengths[i] = adaptive[i];
  return lengths;
}

// A seeded, sampled request's tokens under a draft model depend on which positions had a
// draft; its verify lengths then follow its drafts alone, never the load or the timing, so
// its seed reproduces the completion (given room for its drafts in the cache and the step).
bool Engine::fixed_verification(const Sequence& sequence) const {
  const sampling::SamplingParams& params = sequence.request.sampling;
  return drafter_ && params.seed.has_value() && params.temperature > 0.0f;
}

// The model's own tokens after the sequence's last token and each draft (one logits row each),
// drawn exactly as a plain step would draw them at that output position (the same processors
// and the same seeded uniform), up to and including the first that differs from its draft:
// every draft before it is accepted. For a sampled request this is rejection sampling of a
// draft that is one token for sure: the draw lands on the draft with the target's probability
// of it, and otherwise on a token from the target's distribution without it (the residual),
// so the output follows the target's distribution and a seed gives the plain run's tokens.
// A draft drawn from a drafter's distribution (a sampled request with a model drafter) gets
// the general rule instead (sample_against): kept with probability min(1, p / q), otherwise
// replaced from the residual; the output still follows the target's distribution.
void Engine::verify_drafts(Chunk& chunk, const float* rows) const {
  const Sequence& sequence = *chunk.sequence;
  const sampling::SamplingParams& params = sequence.request.sampling;
  const auto vocab = static_cast<size_t>(model_.config().vocab_size);
  // Penalties and the constraint see the drafts accepted before each row.
  std::optional<sampling::TokenHistory> history;
  if (!sampling::needs_only_logits(params)) history = sequence.history;
  std::unique_ptr<structured::Matcher> matcher =
      sequence.matcher ? sequence.matcher->clone() : nullptr;
  for (size_t r = 0; r <= chunk.drafts.size(); ++r) {
    const sampling::TokenHistory& seen = history ? *history : sequence.history;
    const uint64_t position = chunk.output_position + r;
    if (r < chunk.draft_distributions.size()) {
      chunk.verified.push_back(sample_against(sequence, matcher.get(), seen, rows + r * vocab,
                                              position, chunk.drafts[r],
                                              chunk.draft_distributions[r]));
    } else {
      chunk.verified.push_back(
          sample_under(sequence, matcher.get(), seen, rows + r * vocab, position));
    }
    const int32_t token = chunk.verified.back().token;
    if (r == chunk.drafts.size() || token != chunk.drafts[r]) break;
    if (history) history->add_output(token);
    if (matcher && !matcher->accept(token)) break;  // every token was masked: it ends here
  }
}

sampling::Sample Engine::sample_against(const Sequence& sequence,
                                        const structured::Matcher* matcher,
                                        const sampling::TokenHistory& history, const float* logits,
                                        uint64_t position, int32_t draft,
                                        std::span<const float> draft_distribution) const {
  const int32_t vocab = sampled_vocab_;
  const sampling::SamplingParams& params = sequence.request.sampling;
  std::vector<float> masked(logits, logits + vocab);
  if (matcher) matcher->mask_logits(masked.data(), vocab);
  const std::vector<float> target = sampling::distribution(masked.data(), vocab, params, history);
  auto uniform = [&](sampling::DrawStream stream) {
    return sampling::counter_uniform(sampling::stream_seed(sequence.seed, stream), position);
  };
  const sampling::Verdict verdict = sampling::verify_draft(
      target, draft_distribution, draft, uniform(sampling::DrawStream::kAccept),
      uniform(sampling::DrawStream::kResample));
  sampling::Sample sample;
  sample.token = verdict.token;
  if (params.logprobs) {
    sampling::Sample raw = sampling::score_token(logits, vocab, sample.token, params.top_logprobs);
    sample.logprob = raw.logprob;
    sample.top = std::move(raw.top);
  }
  return sample;
}

// Appends a speculating chunk's verified tokens (up to the one that ends the completion) and
// rolls its KV back to them: positions after them hold rejected drafts, written over later.
void Engine::accept_verified(Chunk& chunk) {
  Sequence& sequence = *chunk.sequence;
  --sequence.pending;
  sequence.speculated -= static_cast<int64_t>(chunk.drafts.size());
  chunk.kept = static_cast<int64_t>(chunk.verified.size());
  acceptance_.observe(sequence.acceptance, chunk.kept - 1,
                      static_cast<int64_t>(chunk.drafts.size()));
  // A step planned since (async scheduling) counted every draft: settle_speculation moves it.
  // A preempted sequence starts over and keeps its count.
  if (chunk.epoch == sequence.epoch) sequence.computed -= chunk.count - chunk.kept;
  for (size_t i = 0; i < chunk.verified.size(); ++i) {
    const int32_t token = chunk.verified[i].token;
    // As for one sampled token: one the mask allowed always fits; one that does not ends it.
    if (sequence.matcher && !sequence.matcher->accept(token)) sequence.stop_requested = true;
    sequence.tokens.push_back(token);
    sequence.generated.push_back(token);
    sequence.history.add_output(token);
    if (ending_after(sequence, token, sequence.generated.size())) {
      chunk.verified.resize(i + 1);
      break;
    }
  }
}

bool Engine::settle_speculation(StepWork& next,
                                const std::unordered_map<const Sequence*, int64_t>& rejected) {
  bool changed = false;
  std::vector<Chunk*> deferred;
  for (Chunk& chunk : next.chunks) {
    if (auto found = rejected.find(chunk.sequence); found != rejected.end() && found->second > 0) {
      chunk.start -= found->second;
      chunk.output_position -= static_cast<uint64_t>(found->second);
      changed = true;
    }
    if (!chunk.drafts_deferred) continue;
    chunk.drafts_deferred = false;
    changed = true;
    deferred.push_back(&chunk);
  }
  std::vector<DraftProposal> proposals = draft_deferred(deferred);
  for (size_t i = 0; i < deferred.size(); ++i) {
    Chunk& chunk = *deferred[i];
    Sequence& sequence = *chunk.sequence;
    const int64_t unused = static_cast<int64_t>(chunk.drafts.size() - proposals[i].tokens.size());
    chunk.drafts = std::move(proposals[i].tokens);
    chunk.draft_distributions = std::move(proposals[i].distributions);
    chunk.count -= unused;
    sequence.computed -= unused;
    sequence.speculated -= unused;
  }
  return changed;
}

std::vector<DraftProposal> Engine::draft_deferred(const std::vector<Chunk*>& chunks) {
  const SpeculativeConfig& speculative = config_.speculative;
  std::vector<DraftProposal> proposals(chunks.size());
  std::vector<DraftAsk> asks;
  std::vector<size_t> asking;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& chunk = *chunks[i];
    const Sequence& sequence = *chunk.sequence;
    // The row's own token is the sequence's last one now, unless the completion ended.
    if (chunk.start + 1 != static_cast<int64_t>(sequence.tokens.size())) continue;
    const auto limit = static_cast<int64_t>(chunk.drafts.size());
    if (drafter_) {
      asks.push_back(draft_ask(sequence, limit));
      asking.push_back(i);
    } else {
      proposals[i].tokens = ngram_drafts(sequence.tokens, speculative.prompt_lookup_min,
                                         speculative.prompt_lookup_max, limit);
    }
  }
  if (asks.empty()) return proposals;
  std::vector<DraftProposal> drafted = drafter_->propose(asks, speculative.confidence_threshold);
  for (size_t j = 0; j < asking.size(); ++j) proposals[asking[j]] = std::move(drafted[j]);
  return proposals;
}

// What the step computed for each sequence still running: a speculating chunk's verified
// positions, every position of the others.
void Engine::absorb_hidden(const StepWork& done) {
  const auto width = static_cast<size_t>(model_.config().hidden_size);
  std::vector<MtpDrafter::Rows> rows;
  for (const Chunk& chunk : done.chunks) {
    const Sequence& sequence = *chunk.sequence;
    if (sequence.finished || chunk.epoch != sequence.epoch) continue;
    const int64_t count = chunk.drafts.empty() ? chunk.count : chunk.kept;
    if ((chunk.first_row + static_cast<size_t>(count)) * width > step_hidden_.size()) continue;
    rows.push_back({&sequence, sequence.tokens, chunk.start, count,
                    step_hidden_.data() + chunk.first_row * width});
  }
  mtp_->absorb(rows);
}

}  // namespace deepinfer
