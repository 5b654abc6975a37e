#include "router/routing.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace deepinfer::router {

std::optional<Role> parse_role(const std::string& text) {
  if (text == "prefill") return Role::kPrefill;
  if (text == "decode") return Role::kDecode;
  if (text == "both") return Role::kBoth;
  return std::nullopt;
}

double PrefillCost::seconds(int64_t cached, int64_t uncached) const {
  // Token i of the uncached part attends over cached + i tokens: summed, uncached * (cached +
  // (uncached - 1) / 2).
  const auto computed = static_cast<double>(uncached);
  const double context = static_cast<double>(cached) + (computed - 1.0) / 2.0;
  return computed * seconds_per_token +
         computed * std::max(0.0, context) * seconds_per_token_context;
}

int64_t PrefixIndex::matched(const PrefixKeys& keys) const {
  int64_t count = 0;
  while (count < static_cast<int64_t>(keys.size()) &&
         where_.contains(keys[static_cast<size_t>(count)]))
    ++count;
  return count;
}

void PrefixIndex::insert(const PrefixKeys& keys) {
  if (capacity_ == 0) return;
  // Later keys first, so that the first keys (needed by every longer match) end up most
  // recently used and are evicted last.
  for (auto key = keys.rbegin(); key != keys.rend(); ++key) {
    auto found = where_.find(*key);
    if (found != where_.end()) order_.erase(found->second);
    order_.push_front(*key);
    where_[*key] = order_.begin();
  }
  while (order_.size() > capacity_) {
    where_.erase(order_.back());
    order_.pop_back();
  }
}

void PrefixIndex::clear() {
  order_.clear();
  where_.clear();
}

size_t Registry::add(std::string url, Role role) {
  WorkerState worker(options_.prefix_capacity);
  worker.url = std::move(url);
  worker.role = role;
  workers_.push_back(std::move(worker));
  return workers_.size() - 1;
}

void Registry::checked(size_t index, bool ok, double now) {
  WorkerState& worker = workers_.at(index);
  if (ok) {
    if (!worker.healthy) worker.prefixes.clear();  // it restarted, or its cache is unknown
    worker.healthy = true;
    worker.failures = 0;
    return;
  }
  worker.healthy = false;
  const double wait = std::min(options_.longest_retry_seconds,
                               options_.first_retry_seconds * std::ldexp(1.0, worker.failures));
  worker.failures = std::min(worker.failures + 1, 30);
  worker.retry_at = now + wait;
}

std::vector<size_t> Registry::due_for_retry(double now) const {
  std::vector<size_t> due;
  for (size_t i = 0; i < workers_.size(); ++i)
    if (!workers_[i].healthy && workers_[i].retry_at <= now) due.push_back(i);
  return due;
}

void Registry::reported(size_t index, const WorkerLoad& load) {
  WorkerState& worker = workers_.at(index);
  worker.load = load;
  worker.routed_tokens = 0;
}

std::optional<PrefillChoice> Registry::route_prefill(const PrefixKeys& keys,
                                                     int64_t prompt_tokens) {
  std::optional<PrefillChoice> best;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const WorkerState& worker = workers_[i];
    if (!worker.healthy || !prefills(worker)) continue;
    // The last prompt token is always computed (its logits give the first output token).
    const int64_t cached = std::min(worker.prefixes.matched(keys) * options_.block_size,
                                    std::max<int64_t>(0, prompt_tokens - 1));
    const int64_t queued = worker.load.queued_prompt_tokens + worker.routed_tokens;
    const double seconds =
        options_.cost.seconds(0, queued) + options_.cost.seconds(cached, prompt_tokens - cached);
    const bool better = !best || seconds < best->seconds ||
                        (seconds == best->seconds && cached > best->cached_tokens);
    if (better) best = PrefillChoice{i, cached, seconds};
  }
  if (!best) return best;
  WorkerState& chosen = workers_[best->worker];
  chosen.routed_tokens += prompt_tokens - best->cached_tokens;
  chosen.prefixes.insert(keys);
  return best;
}

std::optional<size_t> Registry::route_decode(int64_t tokens) const {
  const int64_t blocks = (tokens + options_.block_size - 1) / options_.block_size;
  std::optional<size_t> best;
  auto share = [](const WorkerLoad& load) {
    return load.total_blocks > 0
               ? static_cast<double>(load.free_blocks) / static_cast<double>(load.total_blocks)
               : 0.0;
  };
  auto rank = [&](const WorkerState& worker) {
    // Workers with room for the request first, then the freest, then the least busy.
    return std::make_tuple(worker.load.free_blocks >= blocks, share(worker.load),
                           -worker.load.running);
  };
  for (size_t i = 0; i < workers_.size(); ++i) {
    const WorkerState& worker = workers_[i];
    if (!worker.healthy || !decodes(worker)) continue;
    if (!best || rank(worker) > rank(workers_[*best])) best = i;
  }
  return best;
}

}  // namespace deepinfer::router
