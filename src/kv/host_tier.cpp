#include "kv/host_tier.h"

#include <algorithm>
#include <exception>

namespace deepinfer {
namespace {

// Slots a chunk holds at most: large chunks keep page-locked allocations (slow, and each
// one pins memory) few; the budget bounds the last.
constexpr size_t kChunkBytes = size_t{256} << 20;

}  // namespace

struct HostTier::Slots {
  std::mutex mutex;
  std::vector<std::byte*> free;
  std::vector<BackendMemory> chunks;
};

HostTier::HostTier(size_t capacity_bytes, size_t block_bytes, HostAllocator allocate)
    : block_bytes_(block_bytes),
      max_slots_(block_bytes > 0 ? capacity_bytes / block_bytes : 0),
      allocate_(std::move(allocate)),
      slots_(std::make_shared<Slots>()) {}

std::shared_ptr<std::byte> HostTier::take_free() {
  std::lock_guard lock(slots_->mutex);
  if (slots_->free.empty()) return nullptr;
  std::byte* slot = slots_->free.back();
  slots_->free.pop_back();
  return std::shared_ptr<std::byte>(slot, [slots = slots_](std::byte* returned) {
    std::lock_guard back(slots->mutex);
    slots->free.push_back(returned);
  });
}

bool HostTier::grow() {
  const size_t count =
      std::min(max_slots_ - allocated_slots_, std::max<size_t>(1, kChunkBytes / block_bytes_));
  if (count == 0) return false;
  BackendMemory chunk;
  try {
    chunk = allocate_(count * block_bytes_);
  } catch (const std::exception&) {
    max_slots_ = allocated_slots_;  // the host would not give more: the tier stays this size
    return false;
  }
  auto* base = static_cast<std::byte*>(chunk.get());
  std::lock_guard lock(slots_->mutex);
  for (size_t i = 0; i < count; ++i) slots_->free.push_back(base + i * block_bytes_);
  slots_->chunks.push_back(std::move(chunk));
  allocated_slots_ += count;
  return true;
}

void HostTier::evict_oldest() {
  auto oldest = entries_.find(recency_.front());
  stats_.bytes -= block_bytes_;
  entries_.erase(oldest);  // its slot returns once no reader holds it
  recency_.pop_front();
  ++stats_.evicted;
}

std::shared_ptr<std::byte> HostTier::reserve() {
  std::lock_guard lock(mutex_);
  for (;;) {
    if (auto slot = take_free()) return slot;
    if (allocated_slots_ < max_slots_ && grow()) continue;
    if (recency_.empty()) return nullptr;
    evict_oldest();
  }
}

void HostTier::put(BlockHash key, uint64_t salt, std::vector<int32_t> tokens,
                   std::shared_ptr<std::byte> payload) {
  if (!payload) return;
  std::lock_guard lock(mutex_);
  if (entries_.count(key)) return;  // the same key means the same tokens, salt and content
  stats_.bytes += block_bytes_;
  stats_.bytes_written += block_bytes_;
  ++stats_.stored;
  Entry& entry = entries_[key];
  entry.salt = salt;
  entry.tokens = std::move(tokens);
  entry.payload = std::move(payload);
  entry.recency = recency_.insert(recency_.end(), key);
}

std::shared_ptr<const std::byte> HostTier::get(BlockHash key, uint64_t salt,
                                               std::span<const int32_t> tokens) {
  std::lock_guard lock(mutex_);
  auto found = entries_.find(key);
  if (found == entries_.end() || found->second.salt != salt ||
      !std::equal(tokens.begin(), tokens.end(), found->second.tokens.begin(),
                  found->second.tokens.end()))
    return nullptr;
  recency_.splice(recency_.end(), recency_, found->second.recency);
  ++stats_.loaded;
  stats_.bytes_read += block_bytes_;
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
