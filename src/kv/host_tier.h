// The prefix cache's host-memory tier: copies of published blocks a GPU's pool let go of,
// kept in host memory up to a byte budget (least recently used go first), so a prompt whose
// prefix left device memory is copied back instead of recomputed or read from disk. Blocks
// live in fixed-size slots of memory from the backend (page-locked on a GPU, so the copies
// to and from the device run at the bus's rate with no bounce buffer), taken in chunks as the
// tier fills. Thread safe: the engine thread reserves and puts, fetch threads read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/ops.h"
#include "kv/block_pool.h"

namespace deepinfer {

struct HostTierStats {
  int64_t stored = 0;
  int64_t loaded = 0;
  int64_t evicted = 0;  // for the byte budget
  uint64_t bytes = 0;   // held now
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
};

// Where the tier's slots come from (Ops::allocate_host on a backend).
using HostAllocator = std::function<BackendMemory(size_t bytes)>;

class HostTier {
 public:
  // Blocks of block_bytes each, up to capacity_bytes of them.
  HostTier(size_t capacity_bytes, size_t block_bytes, HostAllocator allocate = host_memory);

  // A slot to read one block's payload into: a free one, a new one while the budget allows,
  // else the least recently used block's. Null when every slot is still being read (or the
  // budget holds no block). Only copies ordered on the backend's queue may fill it: a slot
  // the tier let go of can still be the source of a copy to the device in flight.
  std::shared_ptr<std::byte> reserve();
  // Keeps a filled slot under its key (with its tokens and salt, checked on the way out).
  void put(BlockHash key, uint64_t salt, std::vector<int32_t> tokens,
           std::shared_ptr<std::byte> payload);
  // The block's payload (block_bytes) when held under exactly these tokens and salt (null
  // otherwise): shared, not copied, so that a prefix of thousands of blocks costs no host copy
  // on its way back. A slot the tier lets go of returns to it once its readers are done.
  std::shared_ptr<const std::byte> get(BlockHash key, uint64_t salt,
                                       std::span<const int32_t> tokens);
  bool contains(BlockHash key) const;
  size_t block_bytes() const { return block_bytes_; }
  HostTierStats stats() const;

 private:
  struct Entry {
    uint64_t salt = 0;
    std::vector<int32_t> tokens;
    std::shared_ptr<const std::byte> payload;
    std::list<BlockHash>::iterator recency;
  };
  struct Slots;  // the chunks and the free slots, shared with the slots' deleters

  std::shared_ptr<std::byte> take_free();
  // Adds a chunk of slots; false when the budget or the allocator allows no more.
  bool grow();
  void evict_oldest();

  size_t block_bytes_;
  size_t max_slots_;
  size_t allocated_slots_ = 0;
  HostAllocator allocate_;
  std::shared_ptr<Slots> slots_;
  mutable std::mutex mutex_;
  std::unordered_map<BlockHash, Entry> entries_;
  std::list<BlockHash> recency_;  // least recently used first
  HostTierStats stats_;
};

}  // namespace deepinfer
