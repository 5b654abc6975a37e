// Paged KV storage: fixed-size blocks of tokens, addressed through per-sequence block tables.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace deepinfer {

struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;

  // Bytes one block takes across all layers (K and V, f32).
  size_t bytes_per_block() const;
};

// Owns the K/V storage of every layer and hands out blocks from a free list. The prefix
// cache (content-addressed blocks, LRU reuse) builds on this in the engine.
class KvCache {
 public:
  KvCache(const KvCacheShape& shape, int64_t num_blocks);

  const KvCacheShape& shape() const { return shape_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  PagedKvView layer(int index) const;

  // A free block id, or -1 when none is left.
  int32_t allocate();
  void release(int32_t block);

 private:
  KvCacheShape shape_;
  int64_t num_blocks_;
  std::vector<Buffer> keys_;
  std::vector<Buffer> values_;
  std::vector<int32_t> free_;
};

// The blocks one sequence holds and how many tokens they contain.
class SequenceBlocks {
 public:
  // Grows the table so `tokens` tokens fit; throws Error when the cache is exhausted.
  void reserve(KvCache& cache, int64_t tokens);
  void release_all(KvCache& cache);
  const std::vector<int32_t>& table() const { return blocks_; }
  // Cache slot of token `position`: block * block_size + offset.
  int64_t slot(int64_t position, int block_size) const;

 private:
  std::vector<int32_t> blocks_;
};

}  // namespace deepinfer
