// The prefix cache below memory, as the engine uses it: published full blocks go to the disk
// tier when a sequence lets go of them (finished or preempted) and when the pool evicts one
// that is not there yet; a prompt's blocks that memory lacks are looked up and read on
// background threads, then installed in the pool as cached blocks, so the ordinary memory
// lookup takes them. Nothing here blocks the caller on the disk: offers queue (or drop),
// fetches run beside the engine's steps.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "core/latency_histogram.h"
#include "kv/disk_tier.h"
#include "kv/kv_cache.h"

namespace deepinfer {

struct PrefixTierStats {
  DiskTierStats disk;
  int64_t queried_blocks = 0;     // prompt blocks looked up below memory
  int64_t found_blocks = 0;       // of those, read and checked
  int64_t installed_blocks = 0;   // put in the pool for a waiting request
  int64_t offered_blocks = 0;     // handed to the disk tier's queue
  LatencyHistogram load_seconds;  // per fetch that read something
};

class PrefixTiers {
 public:
  // Offloads `cache`'s blocks (it hooks the pool's evictions until destroyed); blocks the pool
  // evicts are kept `evicted_retention_seconds`. Without `keep_windows` sliding groups' blocks
  // are neither stored nor fetched: a bounded replay rebuilds them (PrefixReplay).
  PrefixTiers(KvCache& cache, DiskTierOptions disk, uint32_t evicted_retention_seconds = 0,
              bool keep_windows = true, int fetch_threads = 2);
  ~PrefixTiers();
  PrefixTiers(const PrefixTiers&) = delete;
  PrefixTiers& operator=(const PrefixTiers&) = delete;

  // Offers the published full blocks of `kv` (a sequence of `tokens`) that no lower tier
  // holds yet, also those a sliding window let go of that memory still has. Call before the
  // sequence releases its blocks.
  // `retention_seconds`: how long the disk keeps them after their last use (0: until capacity
  // needs the space).
  void offload(const SequenceKv& kv, std::span<const int32_t> tokens, uint32_t retention_seconds);

  // Starts fetching the blocks of `tokens`' longest prefix (under `salt`) that memory lacks
  // and the disk may hold. Returns 0 when memory already holds every block worth looking for.
  uint64_t start_fetch(std::span<const int32_t> tokens, uint64_t salt);
  bool ready(uint64_t ticket) const;
  // Puts a ready fetch's blocks in the pool as published blocks and returns them, each with
  // one reference the caller gives back once it has taken what it needs (so nothing evicts
  // them in between). Stops early when the pool has no free block.
  std::vector<int32_t> install(uint64_t ticket);
  // Forgets a fetch (its request went away).
  void cancel(uint64_t ticket);
  bool fetching() const;
  // Waits until some fetch is ready or `timeout` passes.
  void wait(std::chrono::milliseconds timeout) const;
  PrefixTierStats stats() const;
  DiskTier& disk() { return disk_; }

 private:
  struct Block {
    int group = 0;
    int64_t index = 0;
    BlockHash key = 0;
  };
  struct Fetch {
    // Filled by start_fetch.
    std::vector<int32_t> tokens;
    uint64_t salt = 0;
    int block_size = 0;
    size_t payload_bytes = 0;
    KvGroupLayout layout;
    PrefixKeys keys;
    std::vector<std::vector<bool>> in_memory;  // [group][block] when the fetch started
    // Filled by a fetch thread.
    bool done = false;
    std::vector<Block> loaded;
    std::vector<std::vector<std::byte>> payloads;
  };
  // Offers one published block; false when the queue is full.
  bool offer(int32_t block, uint32_t retention_seconds);
  // Whether blocks of cache group `group` go below memory.
  bool stored(int group) const;
  // How many of the first `blocks` blocks a hit can take from what `present` says is held.
  int64_t usable(int64_t blocks,
                 const std::function<bool(int group, int64_t block)>& present) const;
  void fetch_loop();
  void run(Fetch& fetch);

  KvCache& cache_;
  DiskTier disk_;
  uint32_t evicted_retention_seconds_;
  bool keep_windows_;
  mutable std::mutex mutex_;
  mutable std::condition_variable work_, finished_;
  std::map<uint64_t, std::shared_ptr<Fetch>> fetches_;
  std::deque<std::shared_ptr<Fetch>> queue_;
  uint64_t next_ticket_ = 0;
  bool stopping_ = false;
  PrefixTierStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace deepinfer
