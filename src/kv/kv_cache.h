// Paged KV storage: fixed-size blocks of tokens, addressed through per-sequence block tables.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "kv/block_pool.h"

namespace deepinfer {

// Cache groups: layers that keep the same tokens share one block table per sequence. Layers
// are grouped by attention window (0: full attention); when the kinds have different layer
// counts they are cut into groups of gcd(counts) layers, so every group's page holds the same
// number of layers. A block id then means the same bytes in every group and one pool serves
// them all, while a sliding-window group holds only the blocks of its window.
struct KvGroupLayout {
  std::vector<int> group_window;  // per group: 0 full, W > 0 the window
  std::vector<int> layer_group;   // per layer
  std::vector<int> layer_slot;    // per layer: its place in its group's page
  int layers_per_page = 0;

  // `layer_window` per layer (0: full); an empty list means `num_layers` full layers.
  static KvGroupLayout of(const std::vector<int>& layer_window, int num_layers);
  int num_groups() const { return static_cast<int>(group_window.size()); }
};

// What one token stores per layer: num_kv_heads keys of key_dim floats and values of
// value_dim floats, or (values_in_keys) keys only, whose first value_dim floats are the value.
struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int key_dim = 0;
  int value_dim = 0;
  int block_size = 16;
  bool values_in_keys = false;
  std::vector<int> layer_window;  // per layer, 0: full attention (empty: all full)
  DType dtype = DType::kF32;      // what each element is stored as

  // A cache of separate K and V heads of one size (Llama, Qwen, Mistral).
  static KvCacheShape heads(int num_layers, int num_kv_heads, int head_dim, int block_size);
  KvGroupLayout groups() const { return KvGroupLayout::of(layer_window, num_layers); }
  // Elements one token takes in one layer.
  int64_t floats_per_token_layer() const;
  // Bytes one token takes across all layers when every layer keeps it.
  size_t bytes_per_token() const;
  // Bytes per token of the layers that keep the whole context (window 0): what grows with it.
  size_t bytes_per_context_token() const;
  // Bytes one sequence of `context` tokens keeps: whole-context layers for every token,
  // windowed layers for their window's tokens only (before rounding up to blocks).
  double bytes_at_context(int64_t context) const;
  // Bytes one block id stands for: one page of layers_per_page layers.
  size_t bytes_per_block() const;
};

// Owns the K/V storage of every layer; its BlockPool hands out blocks (block 0 is the null
// block) and keeps published full blocks for prefix reuse.
class KvCache {
 public:
  // Storage in host memory, or in the memory `ops` works in (device memory for a GPU).
  KvCache(const KvCacheShape& shape, int64_t num_blocks);
  KvCache(const KvCacheShape& shape, int64_t num_blocks, Ops& ops);

  const KvCacheShape& shape() const { return shape_; }
  const KvGroupLayout& groups() const { return groups_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return pool_.available(); }
  PagedKvView layer(int index) const;
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }

  // A free block id, or -1 when none is left.
  int32_t allocate() { return pool_.allocate(); }
  // A block's bytes in every page slot (keys, then values when kept apart), bytes_per_block()
  // of them: what a lower tier (host memory, disk) stores for it, and restores into a block.
  void read_block(int32_t block, std::span<std::byte> out) const;
  void write_block(int32_t block, std::span<const std::byte> bytes);
  // Host memory read_block and write_block copy to and from fastest (page-locked for a GPU).
  BackendMemory allocate_host(size_t bytes) const {
    return ops_ ? ops_->allocate_host(bytes) : host_memory(bytes);
  }
  void release(int32_t block) { pool_.release(block); }

 private:
  KvCache(const KvCacheShape& shape, int64_t num_blocks,
          const std::function<BackendMemory(size_t)>& allocate);

  // Every page slot's storage of one block: (address, bytes) pairs.
  std::vector<std::pair<std::byte*, size_t>> block_ranges(int32_t block) const;
  // One block's bytes in a GPU's memory, for read_block and write_block (null on the CPU).
  std::byte* staging() const;

  Ops* ops_ = nullptr;  // copies go through it when the storage is a backend's
  KvCacheShape shape_;
  KvGroupLayout groups_;
  int64_t num_blocks_;
  std::vector<BackendMemory> keys_;
  std::vector<BackendMemory> values_;
  mutable BackendMemory staging_;
  BlockPool pool_;
};

// The chained keys of a token sequence's full blocks in every cache group, as every tier
// files them: never the block of the last token (that token is computed for its logits).
struct PrefixKeys {
  std::vector<std::vector<BlockHash>> keys;  // [group][block]
  int64_t blocks() const { return keys.empty() ? 0 : static_cast<int64_t>(keys.front().size()); }
};
PrefixKeys prefix_keys(const KvGroupLayout& layout, int block_size, std::span<const int32_t> tokens,
                       uint64_t salt);
// The salt a group's chain is keyed with: groups hold different layers, so their chains never
// share keys.
uint64_t group_salt(uint64_t salt, int group);
// The first block a query at `position` reads in a group with `window` (0: all of them).
int64_t first_block_read(int64_t position, int window, int block_size);
// How many of the first `blocks` blocks a prefix hit can take, given which (group, block)
// some tier holds: every full-attention group needs all of them, every sliding group the ones
// its window reads from the first uncached position.
int64_t usable_prefix_blocks(const KvGroupLayout& layout, int block_size, int64_t blocks,
                             const std::function<bool(int group, int64_t block)>& present);
// How many of the first `blocks` blocks every full-attention group holds (sliding groups
// aside: a replay rebuilds them). All of them when the layout has no full-attention group.
int64_t full_attention_prefix_blocks(const KvGroupLayout& layout, int64_t blocks,
                                     const std::function<bool(int group, int64_t block)>& present);
bool has_full_attention_group(const KvGroupLayout& layout);

// A prefix rebuilt by bounded replay: the full-attention groups hold restored KV for the
// positions before `restored_end`, which the replay recomputes from `start` on through every
// layer without overwriting it; sliding groups hold nothing before `start`, so their windows
// never reach back past it. A sequence without replay has start == restored_end == 0.
struct PrefixReplay {
  int64_t start = 0;
  int64_t restored_end = 0;
};

// The blocks one sequence holds and how many tokens they contain.
class SequenceBlocks {
 public:
  // Grows the table so `tokens` tokens fit; throws Error when the cache is exhausted.
  void reserve(KvCache& cache, int64_t tokens);
  // As reserve(), but returns false (taking nothing more) when blocks run out: the scheduler
  // then preempts someone instead of failing.
  bool try_reserve(KvCache& cache, int64_t tokens);
  // Publishes the full blocks among the first `computed` tokens (chained keys under `salt`),
  // so later requests with the same prefix reuse them. `group`: the cache group they are in.
  void publish_full_blocks(KvCache& cache, std::span<const int32_t> tokens, int64_t computed,
                           uint64_t salt, int group = 0);
  // Gives back the blocks that hold only tokens before `first_needed` (they left every
  // attention window), leaving the null block in their table slots.
  void release_before(KvCache& cache, int64_t first_needed);
  void release_all(KvCache& cache);
  const std::vector<int32_t>& table() const { return blocks_; }
  // Keys of the leading full blocks published, reused or (before a replay's start) skipped:
  // table()'s first entries; a replay's partly rebuilt first block has a key but no content.
  const std::vector<BlockHash>& keys() const { return hashes_; }
  // Cache slot of token `position`: block * block_size + offset, or -1 (write nothing) for a
  // position whose restored KV a replay must keep.
  int64_t slot(int64_t position, int block_size) const;
  // Blocks try_reserve(tokens) would have to allocate.
  int64_t blocks_missing(int64_t tokens, int block_size) const;
  // Takes the given cached blocks (already referenced) as the table's first entries; null
  // blocks stand for ones outside a window. `hashes` are their chained keys. Positions before
  // `restored_end` are never written (a replay recomputes them, see PrefixReplay).
  void adopt(std::vector<int32_t> blocks, std::vector<BlockHash> hashes, int64_t restored_end = 0);

 private:
  std::vector<int32_t> blocks_;
  std::vector<BlockHash> hashes_;  // keys of the leading full blocks published or reused
  int64_t restored_end_ = 0;
};

// A sequence's blocks in every cache group (see KvGroupLayout).
class SequenceKv {
 public:
  // As SequenceBlocks::reserve / try_reserve, for every group at once.
  void reserve(KvCache& cache, int64_t tokens);
  bool try_reserve(KvCache& cache, int64_t tokens);
  // On empty tables: the longest prefix of `tokens` every group has cached, in whole blocks
  // under `salt` and never the last token (it must be computed for logits); a sliding group
  // needs only the blocks its window still reads. Takes those blocks and returns their token
  // count, from which the sequence computes on.
  // With `replay_tokens` > 0, a longer prefix that only the full-attention groups hold is
  // taken instead when that computes fewer tokens: its last `replay_tokens` tokens are
  // recomputed (see PrefixReplay) and the returned count is where the replay starts.
  int64_t take_cached_prefix(KvCache& cache, std::span<const int32_t> tokens, uint64_t salt,
                             int64_t replay_tokens = 0);
  // Starts a replay on empty tables: the full-attention groups take `restored` (per group
  // [group][block] referenced blocks and their keys, as many as the replay's restored_end
  // covers), sliding groups start empty at `replay.start`.
  void adopt_replay(const KvCache& cache, const PrefixReplay& replay,
                    std::vector<std::vector<int32_t>> restored,
                    std::vector<std::vector<BlockHash>> keys);
  const PrefixReplay& replay() const { return replay_; }
  void publish_full_blocks(KvCache& cache, std::span<const int32_t> tokens, int64_t computed,
                           uint64_t salt);
  // Gives back blocks a sliding-window group no longer reads once the next query sits at
  // `next_position`.
  void release_out_of_window(KvCache& cache, int64_t next_position);
  void release_all(KvCache& cache);
  bool empty() const { return groups_.empty() || groups_.front().table().empty(); }
  int num_groups() const { return static_cast<int>(groups_.size()); }
  const SequenceBlocks& group(int index) const { return groups_[static_cast<size_t>(index)]; }

 private:
  void ensure_groups(const KvCache& cache);
  std::vector<SequenceBlocks> groups_;
  PrefixReplay replay_;
};

}  // namespace deepinfer
