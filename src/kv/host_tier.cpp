#include "kv/host_tier.h"

#include <algorithm>

namespace deepinfer {

void HostTier::put(BlockHash key, uint64_t salt, std::vector<int32_t> tokens,
                   std::vector<std::byte> payload) {
  if (payload.size() > capacity_bytes_) return;
  std::lock_guard lock(mutex_);
  if (entries_.count(key)) return;  // the same key means the same tokens, salt and content
  while (!recency_.empty() && stats_.bytes + payload.size() > capacity_bytes_) {
    auto oldest = entries_.find(recency_.front());
    stats_.bytes -= oldest->second.payload->size();
    entries_.erase(oldest);
    recency_.pop_front();
    ++stats_.evicted;
  }
  stats_.bytes += payload.size();
  stats_.bytes_written += payload.size();
  ++stats_.stored;
  Entry& entry = entries_[key];
  entry.salt = salt;
  entry.tokens = std::move(tokens);
  entry.payload = std::make_shared<const std::vector<std::byte>>(std::move(payload));
  entry.recency = recency_.insert(recency_.end(), key);
}

std::shared_ptr<const std::vector<std::byte>> HostTier::get(BlockHash key, uint64_t salt,
                                                            std::span<const int32_t> tokens) {
  std::lock_guard lock(mutex_);
  auto found = entries_.find(key);
  if (found == entries_.end() || found->second.salt != salt ||
      !std::equal(tokens.begin(), tokens.end(), found->second.tokens.begin(),
                  found->second.tokens.end()))
    return nullptr;
  recency_.splice(recency_.end(), recency_, found->second.recency);
  ++stats_.loaded;
  stats_.bytes_read += found->second.payload->size();
  return found->second.payload;
}

bool HostTier::contains(BlockHash key) const {
  std::lock_guard lock(mutex_);
  return entries_.count(key) > 0;
}

HostTierStats HostTier::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace deepinfer
