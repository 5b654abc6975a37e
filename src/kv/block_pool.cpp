#include "kv/block_pool.h"

#include <xxhash.h>

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

BlockHash block_hash(BlockHash parent, std::span<const int32_t> tokens, uint64_t salt) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, parent ^ (salt * 0x9e3779b97f4a7c15ull));
  XXH64_update(state, &salt, sizeof(salt));
  XXH64_update(state, tokens.data(), tokens.size_bytes());
  BlockHash hash = XXH64_digest(state);
  XXH64_freeState(state);
  return hash;
}

BlockPool::BlockPool(int64_t num_blocks) : blocks_(static_cast<size_t>(num_blocks)) {
  DI_CHECK(num_blocks >= 2, "KV block pool needs at least 2 blocks (one is the null block)");
  blocks_[kNullBlock].references = 1;  // pinned forever
  for (int32_t block = 1; block < num_blocks; ++block)
    blocks_[static_cast<size_t>(block)].idle_position = idle_.insert(idle_.end(), block);
}

int32_t BlockPool::allocate() {
  if (idle_.empty()) return -1;
  int32_t block = idle_.front();
  const Block& entry = blocks_[static_cast<size_t>(block)];
  if (evicting_ && entry.published && !entry.persisted) evicting_(block);
  idle_.pop_front();
  unpublish(block);
  blocks_[static_cast<size_t>(block)].references = 1;
  return block;
}

int64_t BlockPool::forget_idle() {
  int64_t forgotten = 0;
  for (int32_t block : idle_) {
    const Block& entry = blocks_[static_cast<size_t>(block)];
    if (!entry.published) continue;
    if (evicting_ && !entry.persisted) evicting_(block);
    unpublish(block);
    ++forgotten;
  }
  return forgotten;
}

int32_t BlockPool::find_cached(BlockHash hash, std::span<const int32_t> tokens) const {
  auto found = published_.find(hash);
  if (found == published_.end()) return -1;
  const Block& entry = blocks_[static_cast<size_t>(found->second)];
  if (!std::equal(tokens.begin(), tokens.end(), entry.tokens.begin(), entry.tokens.end()))
    return -1;
  return found->second;
}

int32_t BlockPool::take_cached(BlockHash hash, std::span<const int32_t> tokens) {
  int32_t block = find_cached(hash, tokens);
  if (block >= 0) retain(block);
  return block;
}

void BlockPool::publish(int32_t block, BlockHash hash, std::span<const int32_t> tokens,
                        uint64_t salt, int group) {
  Block& entry = blocks_[static_cast<size_t>(block)];
  if (entry.published || published_.count(hash)) return;
  entry.published = true;
  entry.hash = hash;
  entry.salt = salt;
  entry.group = group;
  entry.tokens.assign(tokens.begin(), tokens.end());
  published_[hash] = block;
}

void BlockPool::retain(int32_t block) {
  Block& entry = blocks_[static_cast<size_t>(block)];
  if (entry.references == 0) idle_.erase(entry.idle_position);
  ++entry.references;
}

void BlockPool::release(int32_t block) {
  if (block == kNullBlock) return;
  Block& entry = blocks_[static_cast<size_t>(block)];
  DI_CHECK(entry.references > 0, "KV block {} released more often than taken", block);
  if (--entry.references == 0) entry.idle_position = idle_.insert(idle_.end(), block);
}

void BlockPool::unpublish(int32_t block) {
  Block& entry = blocks_[static_cast<size_t>(block)];
  if (!entry.published) return;
  published_.erase(entry.hash);
  entry.published = false;
  entry.persisted = false;
  entry.retention.reset();
  entry.tokens.clear();
}

bool retention_outlasts(uint32_t seconds, uint32_t than) {
  return than != 0 && (seconds == 0 || seconds > than);
}

void BlockPool::mark_persisted(int32_t block, std::optional<uint32_t> retention) {
  Block& entry = blocks_[static_cast<size_t>(block)];
  entry.persisted = entry.published;
  if (entry.published && retention &&
      (!entry.retention || retention_outlasts(*retention, *entry.retention)))
    entry.retention = retention;
}

void BlockPool::want_retention(int32_t block, uint32_t seconds) {
  Block& entry = blocks_[static_cast<size_t>(block)];
  if (!entry.published) return;
  if (entry.retention && !retention_outlasts(seconds, *entry.retention)) return;
  // A block persisted before anyone asked (installed from the disk) has the file's retention,
  // unknown here: offering it again lets the writer compare.
  entry.retention = seconds;
  entry.persisted = false;
}

}  // namespace deepinfer
