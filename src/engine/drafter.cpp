#include "engine/drafter.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>

#include "core/error.h"

namespace deepinfer {

void SpeculativeConfig::validate() const {
  if (method.empty()) return;
  DI_CHECK(method == "ngram" || method == "draft_model" || method == "mtp",
           "speculative method '{}' is not one of: ngram, draft_model, mtp", method);
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

void StepCosts::measured(int64_t tokens, double seconds) {
  refresh_monotone(times_.insert_or_assign(tokens, seconds).first);
}

void StepCosts::observe(int64_t tokens, double seconds) {
  // A size not measured yet starts from what the table answers for it: its first step may
  // have stalled as much as any later one, and a size judged too slow is rarely run again.
  const bool was_known = known();
  auto [entry, fresh] = times_.emplace(tokens, was_known ? this->seconds(tokens) : seconds);
  if (!fresh || was_known) {
    // Recent times weigh most, in ratio and with each step's say bounded: one step stalled by
    // the machine moves its size a little, not the whole way.
    const double ratio = std::clamp(seconds / entry->second, 1.0 / kLargestRatio, kLargestRatio);
    entry->second *= std::pow(ratio, kNewWeight);
  }
  refresh_monotone(entry);
}

// A forward of more tokens never takes less time: each size answers at least the time of
// every smaller one. A larger size's own time may be stale (profiled at start, without the
// step's own work, or last run long ago); when too low, it makes drafts look cheap, they run,
// and its time is measured afresh.
void StepCosts::refresh_monotone(std::map<int64_t, double>::const_iterator changed) {
  auto at = std::lower_bound(
      monotone_.begin(), monotone_.end(), changed->first,
      [](const std::pair<int64_t, double>& point, int64_t size) { return point.first < size; });
  if (at == monotone_.end() || at->first != changed->first) at = monotone_.insert(at, *changed);
  // Only sizes from the changed one on can change, and they stop at the first that does not.
  auto i = static_cast<size_t>(at - monotone_.begin());
  for (auto raw = changed; raw != times_.end(); ++raw, ++i) {
    const double value = std::max(raw->second, i == 0 ? 0.0 : monotone_[i - 1].second);
    if (raw != changed && value == monotone_[i].second) break;
    monotone_[i].second = value;
  }
}

double StepCosts::seconds(int64_t tokens) const {
  if (monotone_.empty()) return 0.0;
  auto above = std::lower_bound(
      monotone_.begin(), monotone_.end(), tokens,
      [](const std::pair<int64_t, double>& point, int64_t size) { return point.first < size; });
  if (above != monotone_.end() && above->first == tokens) return above->second;
  if (above == monotone_.begin()) return above->second;  // smaller than any measured: at most that
  auto below = std::prev(above);
  if (above == monotone_.end()) {
    if (below == monotone_.begin()) return below->second;
    auto before = std::prev(below);
    const double slope =
        (below->second - before->second) / static_cast<double>(below->first - before->first);
    return below->second + slope * static_cast<double>(tokens - below->first);
  }
  const double t =
      static_cast<double>(tokens - below->first) / static_cast<double>(above->first - below->first);
  return below->second + t * (above->second - below->second);
}

namespace {
void add_trials(AcceptanceTrials& trials, double accepted, double count, double keep) {
  const double kept = std::pow(keep, count);
  trials.accepted = trials.accepted * kept + accepted;
  trials.trials = trials.trials * kept + count;
}
}  // namespace

AcceptanceModel::AcceptanceModel(double prior) : prior_(prior) {}

double AcceptanceModel::pooled() const {
  return (pooled_.accepted + kPriorTrials * prior_) / (pooled_.trials + kPriorTrials);
}

double AcceptanceModel::chance(const AcceptanceTrials& own) const {
  return (own.accepted + kShrinkTrials * pooled()) / (own.trials + kShrinkTrials);
}

void AcceptanceModel::observe(AcceptanceTrials& own, int64_t accepted, int64_t drafts) {
  if (drafts <= 0) return;
  // The draft after the last accepted one was tried too, unless every draft was kept.
  const auto kept = static_cast<double>(accepted);
  const double trials = std::min(kept + 1, static_cast<double>(drafts));
  add_trials(own, kept, trials, kOwnKeep);
  add_trials(pooled_, kept, trials, kPooledKeep);
}

namespace {
constexpr double kLongestProfiledForward = 0.25;  // seconds
constexpr int kProfileRuns = 4;                   // the first one warms up
constexpr double kRepeatedProfileBelow = 0.02;    // seconds
constexpr int64_t kSteadyCatchUp = 2;  // tokens a drafting request's first draft forward computes
}  // namespace

void profile_forward_costs(CausalLM& model, KvCache& cache, int64_t largest, StepCosts& costs) {
  SequenceKv kv;
  if (largest < 1 || !kv.try_reserve(cache, largest)) return;
  const int block_size = cache.shape().block_size;
  BackendTensor logits(model.ops(), {1, model.config().vocab_size});
  Tensor logits_view = logits.view();
  for (int64_t tokens = 1; tokens <= largest; tokens *= 2) {
    ForwardBatch batch;
    batch.add_sequence(std::vector<int32_t>(static_cast<size_t>(tokens), 0), 0, kv, block_size,
                       false);
    // The first run of a size warms it (recorded decode steps, caches, the first forward's
    // thread start and page faults); the fastest of the runs after it counts, as long as
    // they are short.
    double seconds = 0.0;
    for (int run = 0; run < kProfileRuns; ++run) {
      const auto start = std::chrono::steady_clock::now();
      model.forward_into(batch, cache, logits_view);
      model.ops().synchronize();
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      seconds = run == 1 ? took : std::min(seconds, took);
      if (run >= 1 && took > kRepeatedProfileBelow) break;
    }
    costs.measured(tokens, seconds);
    // Larger sizes are extrapolated rather than timed at start (a big model on a CPU).
    if (seconds > kLongestProfiledForward) break;
  }
  kv.release_all(cache);
}

std::vector<int64_t> verified_drafts(const std::vector<DraftOffer>& offers, int64_t rows,
                                     int64_t tokens, const StepCosts& costs,
                                     const StepCosts* draft_costs) {
  // Drafts in the order they are worth taking: each offer's next draft is worth its chance
  // times the one before, so the best next draft is always at some offer's front.
  std::priority_queue<std::pair<double, size_t>> next;
  for (size_t i = 0; i < offers.size(); ++i)
    if (offers[i].proposed > 0) next.emplace(offers[i].chance(0), i);
  std::vector<int64_t> taken(offers.size(), 0), best = taken;
  // Making drafts: one forward of the draft per depth, over the offers drafting that deep.
  std::vector<int64_t> depth_tokens;
  double drafting_seconds = 0.0;
  double produced = static_cast<double>(rows);
  double best_rate = produced / std::max(costs.seconds(tokens), 1e-9);
  for (int64_t n = 1; !next.empty(); ++n) {
    auto [gain, i] = next.top();
    next.pop();
    const auto depth = static_cast<size_t>(taken[i]++);
    produced += gain;
    if (taken[i] < offers[i].proposed)
      next.emplace(gain * offers[i].chance(static_cast<size_t>(taken[i])), i);
    if (draft_costs) {
      if (depth_tokens.size() <= depth) depth_tokens.resize(depth + 1, 0);
      const int64_t before = depth_tokens[depth];
      // The first forward computes one token a request in the steady state (the last one,
      // and whatever the step before accepted); a request behind by more (it has not drafted
      // for a while, or ever) catches up once for every step after, so this step pays only
      // its share of that forward.
      const int64_t behind = std::max<int64_t>(offers[i].catch_up, 1);
      depth_tokens[depth] += depth == 0 ? std::min<int64_t>(behind, kSteadyCatchUp) : 1;
      drafting_seconds += draft_costs->seconds(depth_tokens[depth]) -
                          (before == 0 ? 0.0 : draft_costs->seconds(before));
      if (depth == 0 && behind > kSteadyCatchUp)
        drafting_seconds += (draft_costs->seconds(behind) - draft_costs->seconds(kSteadyCatchUp)) /
                            std::max(offers[i].catch_up_steps, 1.0);
    }
    const double rate = produced / std::max(costs.seconds(tokens + n) + drafting_seconds, 1e-9);
    if (rate > best_rate) {
      best_rate = rate;
      best = taken;
    }
  }
  return best;
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
