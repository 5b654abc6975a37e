#include "engine/drafter.h"

#include <algorithm>
#include <cmath>
#include <queue>

#include "core/error.h"

namespace deepinfer {

void SpeculativeConfig::validate() const {
  if (method.empty()) return;
  DI_CHECK(method == "ngram" || method == "draft_model",
           "speculative method '{}' is not one of: ngram, draft_model", method);
  DI_CHECK(method != "draft_model" || !model.empty(),
           "the draft_model method needs 'model', the draft's folder");
  DI_CHECK(confidence_threshold >= 0.0 && confidence_threshold < 1.0,
           "confidence_threshold {} is not in [0, 1)", confidence_threshold);
  DI_CHECK(num_speculative_tokens >= 0 && num_speculative_tokens <= 64,
           "num_speculative_tokens {} is not in [0, 64]", num_speculative_tokens);
  DI_CHECK(verification == "adaptive" || verification == "always",
           "verification '{}' is not one of: adaptive, always", verification);
  DI_CHECK(prompt_lookup_min >= 1 && prompt_lookup_min <= prompt_lookup_max,
           "prompt_lookup_min {} must be at least 1 and at most prompt_lookup_max {}",
           prompt_lookup_min, prompt_lookup_max);
}

void StepCosts::observe(int64_t tokens, double seconds) {
  const auto x = static_cast<double>(tokens);
  weight_ = kDecay * weight_ + 1;
  x_ = kDecay * x_ + x;
  y_ = kDecay * y_ + seconds;
  xx_ = kDecay * xx_ + x * x;
  xy_ = kDecay * xy_ + x * seconds;
}

bool StepCosts::known() const {
  if (weight_ < 4) return false;
  const double mean = x_ / weight_;
  return xx_ / weight_ - mean * mean > 0.25;  // sizes differ by about a token at least
}

double StepCosts::seconds_per_token() const {
  const double mean_x = x_ / weight_, mean_y = y_ / weight_;
  const double variance = xx_ / weight_ - mean_x * mean_x;
  return std::max(0.0, (xy_ / weight_ - mean_x * mean_y) / variance);
}

double StepCosts::fixed_seconds() const {
  return std::max(0.0, y_ / weight_ - seconds_per_token() * x_ / weight_);
}

std::vector<int64_t> verified_drafts(const std::vector<DraftOffer>& offers, int64_t rows,
                                     int64_t tokens, const StepCosts& costs,
                                     double seconds_per_draft) {
  std::vector<int64_t> taken(offers.size(), 0);
  const double per_token = costs.seconds_per_token();
  const double per_draft = per_token + seconds_per_draft;
  double produced = static_cast<double>(rows);
  double seconds = costs.fixed_seconds() + per_token * static_cast<double>(tokens);
  // (expected tokens of the next draft, offer): each offer's next draft is worth its
  // acceptance times the one before, so the best next draft is always at some offer's front.
  std::priority_queue<std::pair<double, size_t>> next;
  for (size_t i = 0; i < offers.size(); ++i)
    if (offers[i].proposed > 0) next.emplace(offers[i].chance(0), i);
  while (!next.empty()) {
    auto [gain, i] = next.top();
    next.pop();
    // Worth it when the tokens it adds per second it costs beat the step's rate so far.
    if (gain * seconds <= produced * per_draft) break;
    ++taken[i];
    produced += gain;
    seconds += per_draft;
    if (taken[i] < offers[i].proposed)
      next.emplace(gain * offers[i].chance(static_cast<size_t>(taken[i])), i);
  }
  return taken;
}

std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int min_n, int max_n,
                                  int64_t limit) {
  const auto size = static_cast<int64_t>(tokens.size());
  if (limit <= 0) return {};
  for (int64_t n = std::min<int64_t>(max_n, size - 1); n >= min_n; --n) {
    std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(size - n));
    // Latest occurrence first: recent context predicts the continuation best. Any earlier
    // start counts (runs of one token overlap themselves); a token always follows it.
    for (int64_t start = size - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min(limit, size - from);
      return {tokens.begin() + from, tokens.begin() + from + count};
    }
  }
  return {};
}

}  // namespace deepinfer
