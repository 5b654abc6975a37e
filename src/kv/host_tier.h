// The prefix cache's host-memory tier: copies of published blocks a GPU's pool let go of,
// kept in host memory up to a byte budget (least recently used go first), so a prompt whose
// prefix left device memory is copied back instead of recomputed or read from disk. Thread
// safe: the engine thread offers, fetch threads read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

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

class HostTier {
 public:
  explicit HostTier(size_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  // Keeps a block's payload under its key (with its tokens and salt, checked on the way out);
  // the least recently used blocks go while the budget is exceeded. A block larger than the
  // whole budget is not kept.
  void put(BlockHash key, uint64_t salt, std::vector<int32_t> tokens,
           std::vector<std::byte> payload);
  // The block's payload when held under exactly these tokens and salt (null otherwise): shared,
  // not copied, so that a prefix of thousands of blocks costs no host copy on its way back.
  // Payloads never change; one the tier lets go of lives on with its readers.
  std::shared_ptr<const std::vector<std::byte>> get(BlockHash key, uint64_t salt,
                                                    std::span<const int32_t> tokens);
  bool contains(BlockHash key) const;
  HostTierStats stats() const;

 private:
  struct Entry {
    uint64_t salt = 0;
    std::vector<int32_t> tokens;
    std::shared_ptr<const std::vector<std::byte>> payload;
    std::list<BlockHash>::iterator recency;
  };

  size_t capacity_bytes_;
  mutable std::mutex mutex_;
  std::unordered_map<BlockHash, Entry> entries_;
  std::list<BlockHash> recency_;  // least recently used first
  HostTierStats stats_;
};

}  // namespace deepinfer
