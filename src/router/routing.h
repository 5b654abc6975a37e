// Where the router sends a request: prefill by estimated compute with cache affinity, decode
// by load, over a registry of workers that are health-checked and come back after failing.
// Pure policy (no transport, no clock of its own): the router's HTTP side feeds it what workers
// report and what it routed, and asks it for a worker.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace deepinfer::router {

enum class Role { kPrefill, kDecode, kBoth };
// "prefill", "decode" or "both"; nullopt for anything else.
std::optional<Role> parse_role(const std::string& text);

// What a worker last reported of itself (its /metrics or load endpoint).
struct WorkerLoad {
  int64_t queued_prompt_tokens = 0;  // prompt tokens admitted but not yet computed
  int64_t running = 0;               // sequences decoding
  int64_t free_blocks = 0, total_blocks = 0;
};

// Seconds a prefill takes by its tokens: a per-token cost for the products plus one that
// grows with the context each token attends over (cached tokens are attended, not computed).
struct PrefillCost {
  double seconds_per_token = 1e-4;
  double seconds_per_token_context = 1e-9;  // per token computed, per token of context before it
  // The time of computing `uncached` tokens after `cached` ones.
  double seconds(int64_t cached, int64_t uncached) const;
};

// The prompt's prefix keys, one per full block of tokens, each chaining the ones before (as
// the workers' prefix caches key blocks): a worker that holds key i holds every key before it.
using PrefixKeys = std::vector<uint64_t>;

// The keys a worker is known to hold, most recently used first, at most `capacity` of them:
// what the router routed there (a worker's cache evicts least recently used blocks too).
class PrefixIndex {
 public:
  explicit PrefixIndex(size_t capacity) : capacity_(capacity) {}
  // The count of leading keys held.
  int64_t matched(const PrefixKeys& keys) const;
  void insert(const PrefixKeys& keys);
  void clear();
  size_t size() const { return order_.size(); }

 private:
  size_t capacity_;
  std::list<uint64_t> order_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

struct WorkerState {
  std::string url;
  Role role = Role::kBoth;
  bool healthy = true;
  int failures = 0;           // failed checks in a row
  double retry_at = 0.0;      // while unhealthy: when to check again (the caller's clock)
  WorkerLoad load;            // last reported
  int64_t routed_tokens = 0;  // prompt tokens routed since that report (not yet in it)
  PrefixIndex prefixes;
  explicit WorkerState(size_t prefix_capacity) : prefixes(prefix_capacity) {}
};

struct PrefillChoice {
  size_t worker = 0;
  int64_t cached_tokens = 0;  // the prompt's tokens the worker is expected to hold
  double seconds = 0.0;       // its estimated wait and compute
};

class Registry {
 public:
  struct Options {
    int64_t block_size = 16;         // tokens a prefix key covers
    size_t prefix_capacity = 65536;  // keys remembered per worker
    double first_retry_seconds = 1.0, longest_retry_seconds = 30.0;
    PrefillCost cost;
  };
  explicit Registry(Options options) : options_(options) {}

  size_t add(std::string url, Role role);
  const std::vector<WorkerState>& workers() const { return workers_; }

  // A health check's outcome at `now` (seconds on the caller's clock): a failure takes the
  // worker out of routing and backs its next check off exponentially; a success puts it back.
  // A worker that comes back has lost its cache, as far as the router knows.
  void checked(size_t worker, bool ok, double now);
  // Workers whose next health check is due at `now` (healthy ones are checked by the caller's
  // period; unhealthy ones when their back-off has passed).
  std::vector<size_t> due_for_retry(double now) const;
  void reported(size_t worker, const WorkerLoad& load);

  // The prefill worker with the least estimated time to the first token: its queued work
  // (reported plus routed since) and this prompt's uncached part, both at the cost model;
  // more cached tokens break ties. Records the route (the prompt's keys now live there).
  // nullopt when no healthy worker can prefill.
  std::optional<PrefillChoice> route_prefill(const PrefixKeys& keys, int64_t prompt_tokens);
  // The decode worker with the most free KV (share of its blocks), then the fewest running
  // sequences; nullopt when none is healthy.
  std::optional<size_t> route_decode(int64_t tokens) const;

 private:
  bool prefills(const WorkerState& worker) const { return worker.role != Role::kDecode; }
  bool decodes(const WorkerState& worker) const { return worker.role != Role::kPrefill; }
  Options options_;
  std::vector<WorkerState> workers_;
};

}  // namespace deepinfer::router
