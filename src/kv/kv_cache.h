// Paged KV storage: fixed-size blocks of tokens, addressed through per-sequence block tables.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "kv/block_pool.h"

namespace deepinfer {

// What one token stores per layer: num_kv_heads keys of key_dim floats and values of
// value_dim floats, or (values_in_keys) keys only, whose first value_dim floats are the value.
struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int key_dim = 0;
  int value_dim = 0;
  int block_size = 16;
  bool values_in_keys = false;

  // A cache of separate K and V heads of one size (Llama, Qwen, Mistral).
  static KvCacheShape heads(int num_layers, int num_kv_heads, int head_dim, int block_size);
  // Floats one token takes in one layer.
  int64_t floats_per_token_layer() const;
  // Bytes one token takes across all layers, and one block.
  size_t bytes_per_token() const;
  size_t bytes_per_block() const { return bytes_per_token() * static_cast<size_t>(block_size); }
};

// Owns the K/V storage of every layer; its BlockPool hands out blocks (block 0 is the null
// block) and keeps published full blocks for prefix reuse.
class KvCache {
 public:
  KvCache(const KvCacheShape& shape, int64_t num_blocks);

  const KvCacheShape& shape() const { return shape_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return pool_.available(); }
  PagedKvView layer(int index) const;
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }

  // A free block id, or -1 when none is left.
  int32_t allocate() { return pool_.allocate(); }
  void release(int32_t block) { pool_.release(block); }

 private:
  KvCacheShape shape_;
  int64_t num_blocks_;
  std::vector<Buffer> keys_;
  std::vector<Buffer> values_;
  BlockPool pool_;
};

// The blocks one sequence holds and how many tokens they contain.
class SequenceBlocks {
 public:
  // Grows the table so `tokens` tokens fit; throws Error when the cache is exhausted.
  void reserve(KvCache& cache, int64_t tokens);
  // As reserve(), but returns false (taking nothing more) when blocks run out: the scheduler
  // then preempts someone instead of failing.
  bool try_reserve(KvCache& cache, int64_t tokens);
  // On an empty table: takes the published blocks holding the longest prefix of `tokens`
  // (whole blocks under `salt`; never the last token, which must be computed for logits).
  // Returns how many tokens are already in the cache.
  int64_t take_cached_prefix(KvCache& cache, std::span<const int32_t> tokens, uint64_t salt);
  // Publishes the full blocks among the first `computed` tokens (chained keys under `salt`),
  // so later requests with the same prefix reuse them.
  void publish_full_blocks(KvCache& cache, std::span<const int32_t> tokens, int64_t computed,
                           uint64_t salt);
  // Gives back the blocks that hold only tokens before `first_needed` (they left every
  // attention window), leaving the null block in their table slots.
  void release_before(KvCache& cache, int64_t first_needed);
  void release_all(KvCache& cache);
  const std::vector<int32_t>& table() const { return blocks_; }
  // Cache slot of token `position`: block * block_size + offset.
  int64_t slot(int64_t position, int block_size) const;

 private:
  std::vector<int32_t> blocks_;
  std::vector<BlockHash> hashes_;  // keys of the leading full blocks published or reused
};

}  // namespace deepinfer
