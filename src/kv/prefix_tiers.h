// The prefix cache below the pool, as the engine uses it: published full blocks go to the
// host-memory tier (a GPU's pool) and the disk tier when a sequence lets go of them (finished
// or preempted) and when the pool evicts one that is not there yet; a prompt's blocks that
// the pool lacks are looked up (host memory first, then disk) and read on background
// threads, then installed in the pool as cached blocks, so the ordinary lookup takes them.
// Nothing here blocks the caller on the disk: offers queue (or drop), fetches run beside the
// engine's steps.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "core/latency_histogram.h"
#include "kv/disk_tier.h"
#include "kv/host_tier.h"
#include "kv/kv_cache.h"

namespace deepinfer {

struct PrefixTierOptions {
  size_t host_bytes = 0;                // the host-memory tier's budget (0: none)
  std::optional<DiskTierOptions> disk;  // the disk tier (none: no disk)
  // How long the disk keeps blocks the pool evicts (their requests' classes are not known).
  uint32_t evicted_retention_seconds = 0;
  // Whether sliding groups' blocks go below the pool; without, a bounded replay rebuilds
  // them (PrefixReplay).
  bool keep_windows = true;
  int fetch_threads = 2;
};

struct PrefixTierStats {
  bool has_host = false, has_disk = false;
  HostTierStats host;
  DiskTierStats disk;
  int64_t queried_blocks = 0;     // prompt blocks looked up below the pool
  int64_t found_blocks = 0;       // of those, read (and checked) from some tier
  int64_t host_found_blocks = 0;  // of those, from host memory
  int64_t installed_blocks = 0;   // put in the pool for a waiting request
  int64_t offered_blocks = 0;     // handed to the disk tier's queue
  LatencyHistogram load_seconds;  // per fetch that read something
};

class PrefixTiers {
 public:
  // Offloads `cache`'s blocks (it hooks the pool's evictions until destroyed).
  PrefixTiers(KvCache& cache, PrefixTierOptions options);
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
    std::vector<std::shared_ptr<const std::byte>> payloads;  // payload_bytes each
    std::vector<std::optional<uint32_t>> retentions;         // the disk file's, for each payload
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

  // A block's payload from host memory or disk, checked; none when neither has it.
  // (`retention`: the disk file's; `from_host` counts the ones host memory gave.)
  std::shared_ptr<const std::byte> load(const Fetch& fetch, const Block& block,
                                        std::optional<uint32_t>& retention, int64_t& from_host);

  KvCache& cache_;
  PrefixTierOptions options_;
  std::optional<HostTier> host_;
  std::optional<DiskTier> disk_;
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
