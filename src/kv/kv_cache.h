// Paged KV storage: fixed-size blocks of tokens, addressed through per-sequence block tables.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

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
