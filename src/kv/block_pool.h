// KV block bookkeeping with prefix caching: reference-counted blocks, full blocks published
// under a chained content key, idle blocks kept in least-recently-used order and reused on a
// later hit until something needs the space.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace deepinfer {

using BlockHash = uint64_t;

// Key of a full block: the previous block's key (0 for the first), its tokens, and the
// request's cache salt, so requests with different salts never share a block.
BlockHash block_hash(BlockHash parent, std::span<const int32_t> tokens, uint64_t salt);

// Whether a lower tier keeping a block `seconds` after its last use keeps it longer than
// `than` seconds would (0: no expiry, only capacity removes it).
bool retention_outlasts(uint32_t seconds, uint32_t than);

class BlockPool {
 public:
  // Block 0 is the null block (padding in block tables); it is never handed out.
  static constexpr int32_t kNullBlock = 0;
  explicit BlockPool(int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Blocks allocate() can still hand out: never used, or idle (possibly cached).
  int64_t available() const { return static_cast<int64_t>(idle_.size()); }
  // A block for new content with one reference: the least recently used idle block, whose
  // cached content (if any) is forgotten. -1 when every block is in use.
  int32_t allocate();
  // The published block holding exactly `tokens` under `hash`, with a reference taken; -1 on
  // a miss (a key match with different tokens is a miss).
  int32_t take_cached(BlockHash hash, std::span<const int32_t> tokens);
  // As take_cached, without taking anything.
  int32_t find_cached(BlockHash hash, std::span<const int32_t> tokens) const;
  // Makes a full block findable; `salt` is the one its key was made with (a lower tier files
  // it beside the block), `group` the cache group it belongs to. Content already published
  // elsewhere keeps its first block.
  void publish(int32_t block, BlockHash hash, std::span<const int32_t> tokens, uint64_t salt = 0,
               int group = 0);
  // Forgets the content of every idle published block (offered to the eviction hook first, as
  // allocate() would); blocks in use keep theirs. Returns how many were forgotten.
  int64_t forget_idle();
  void retain(int32_t block);
  // Drops a reference; at zero the block is idle and, if published, still findable.
  void release(int32_t block);
  int references(int32_t block) const { return blocks_[static_cast<size_t>(block)].references; }
  bool is_cached(int32_t block) const { return blocks_[static_cast<size_t>(block)].published; }
  // A published block whose content a lower tier (disk) holds or is writing, with the
  // longest retention asked for so far: it is not offered again until a request asks for a
  // longer one. Forgotten with the content.
  bool is_persisted(int32_t block) const { return blocks_[static_cast<size_t>(block)].persisted; }
  // `retention`: what the lower tier keeps it with, when known.
  void mark_persisted(int32_t block, std::optional<uint32_t> retention = std::nullopt);
  // Records that a request using this published block wants it kept `seconds` after its last
  // use on a lower tier (0: until capacity needs the room); the longest wish wins, and a
  // longer one than the block was persisted with makes it due for offering again.
  void want_retention(int32_t block, uint32_t seconds);
  // The longest retention requests asked for this block, if any did.
  std::optional<uint32_t> retention_of(int32_t block) const {
    return blocks_[static_cast<size_t>(block)].retention;
  }
  // A published block's key, tokens and salt.
  BlockHash key_of(int32_t block) const { return blocks_[static_cast<size_t>(block)].hash; }
  const std::vector<int32_t>& tokens_of(int32_t block) const {
    return blocks_[static_cast<size_t>(block)].tokens;
  }
  uint64_t salt_of(int32_t block) const { return blocks_[static_cast<size_t>(block)].salt; }
  int group_of(int32_t block) const { return blocks_[static_cast<size_t>(block)].group; }
  // Called by allocate() with a published block that no lower tier holds, just before its
  // content is forgotten: the last moment to offload it.
  void set_eviction_hook(std::function<void(int32_t block)> hook) { evicting_ = std::move(hook); }

  // Prefix-cache hit rate: full prompt blocks looked up, and those found.
  void record_lookup(int64_t blocks, int64_t found) {
    lookups_ += blocks;
    hits_ += found;
  }
  int64_t lookups() const { return lookups_; }
  int64_t hits() const { return hits_; }

 private:
  struct Block {
    int references = 0;
    bool published = false;
    bool persisted = false;
    std::optional<uint32_t> retention;
    BlockHash hash = 0;
    uint64_t salt = 0;
    int group = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator idle_position;
  };
  void unpublish(int32_t block);

  std::vector<Block> blocks_;
  std::list<int32_t> idle_;  // references == 0, least recently used first
  std::unordered_map<BlockHash, int32_t> published_;
  std::function<void(int32_t)> evicting_;
  int64_t lookups_ = 0;
  int64_t hits_ = 0;
};

}  // namespace deepinfer
