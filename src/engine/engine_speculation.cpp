// Speculative decoding inside the engine's step: which decodes verify drafts and how many,
// and what their verification keeps (see SpeculativeConfig).
#include <algorithm>
#include <optional>

#include "engine/engine_state.h"

namespace deepinfer {

// Every decoding request may speculate (its output is the same either way, see
// verify_drafts). Drafts stop short of max_tokens and the context length.
std::vector<int32_t> Engine::drafts_for(const Sequence& sequence, int64_t budget) const {
  const SpeculativeConfig& speculative = config_.speculative;
  const GenerationRequest& request = sequence.request;
  if (!speculative.enabled() || runner_ || sequence.pending > 0 ||
      sequence.computed + 1 != static_cast<int64_t>(sequence.tokens.size()))
    return {};
  const int64_t limit =
      std::min<int64_t>({speculative.num_speculative_tokens, budget,
                         request.max_tokens - static_cast<int64_t>(sequence.generated.size()) - 1,
                         model_.config().max_position_embeddings - sequence.length()});
  return ngram_drafts(sequence.tokens, speculative.prompt_lookup_min, speculative.prompt_lookup_max,
                      limit);
}

void Engine::choose_drafts(std::vector<Planned>& planned, int64_t& budget) {
  if (!config_.speculative.enabled()) return;
  std::vector<DraftOffer> offers;
  int64_t rows = 0, tokens = 0;
  for (Planned& plan : planned) {
    tokens += plan.count;
    const Sequence& sequence = *plan.sequence;
    if (plan.count == 1 || sequence.computed + plan.count == sequence.length()) ++rows;
    if (plan.count == 1) plan.drafts = drafts_for(sequence, budget);
    offers.push_back({static_cast<int64_t>(plan.drafts.size()), sequence.acceptance});
  }
  std::vector<int64_t> taken(offers.size());
  if (config_.speculative.verification == "adaptive" && step_costs_.known()) {
    taken = verified_drafts(offers, rows, tokens, step_costs_);
  } else {
    for (size_t i = 0; i < offers.size(); ++i) taken[i] = offers[i].proposed;
  }
  for (size_t i = 0; i < planned.size(); ++i) {
    Planned& plan = planned[i];
    const int64_t count = std::min(taken[i], budget);
    // A draft is never worth a preemption: its blocks come from free ones only.
    if (count <= 0 ||
        !plan.sequence->blocks.try_reserve(cache_, plan.sequence->computed + 1 + count)) {
      plan.drafts.clear();
      continue;
    }
    plan.drafts.resize(static_cast<size_t>(count));
    budget -= count;
  }
}

// The model's own tokens after the sequence's last token and each draft (one logits row each),
// drawn exactly as a plain step would draw them at that output position (the same processors
// and the same seeded uniform), up to and including the first that differs from its draft:
// every draft before it is accepted. For a sampled request this is rejection sampling of a
// draft that is one token for sure: the draw lands on the draft with the target's probability
// of it, and otherwise on a token from the target's distribution without it (the residual),
// so the output follows the target's distribution and a seed gives the plain run's tokens.
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
    chunk.verified.push_back(sample_under(sequence, matcher.get(),
                                          history ? *history : sequence.history, rows + r * vocab,
                                          chunk.output_position + r));
    const int32_t token = chunk.verified.back().token;
    if (r == chunk.drafts.size() || token != chunk.drafts[r]) break;
    if (history) history->add_output(token);
    if (matcher && !matcher->accept(token)) break;  // every token was masked: it ends here
  }
}

// Appends a speculating chunk's verified tokens (up to the one that ends the completion) and
// rolls its KV back to them: positions after them hold rejected drafts, written over later.
void Engine::accept_verified(Chunk& chunk) {
  Sequence& sequence = *chunk.sequence;
  --sequence.pending;
  chunk.kept = static_cast<int64_t>(chunk.verified.size());
  // Each draft up to the first rejected one is one observation of the acceptance chance.
  const auto accepted = static_cast<double>(chunk.kept - 1);
  const double observed = std::min(accepted + 1, static_cast<double>(chunk.drafts.size()));
  const double weight = 0.1 * observed;
  sequence.acceptance += weight * (accepted / observed - sequence.acceptance) / (1 + weight);
  sequence.computed = chunk.start + chunk.kept;
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

}  // namespace deepinfer
