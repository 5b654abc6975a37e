#include "kv/kv_cache.h"

#include "core/error.h"

namespace deepinfer {

size_t KvCacheShape::bytes_per_block() const {
  return 2 * sizeof(float) * static_cast<size_t>(num_layers) * static_cast<size_t>(block_size) *
         static_cast<size_t>(num_kv_heads) * static_cast<size_t>(head_dim);
}

KvCache::KvCache(const KvCacheShape& shape, int64_t num_blocks)
    : shape_(shape), num_blocks_(num_blocks) {
  DI_CHECK(num_blocks > 0, "KV cache needs at least one block");
  size_t layer_bytes =
      sizeof(float) * static_cast<size_t>(num_blocks) * static_cast<size_t>(shape.block_size) *
      static_cast<size_t>(shape.num_kv_heads) * static_cast<size_t>(shape.head_dim);
  for (int layer = 0; layer < shape.num_layers; ++layer) {
    keys_.emplace_back(layer_bytes);
    values_.emplace_back(layer_bytes);
  }
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t block = num_blocks - 1; block >= 0; --block)
    free_.push_back(static_cast<int32_t>(block));
}

PagedKvView KvCache::layer(int index) const {
  PagedKvView view;
  view.keys = static_cast<float*>(keys_[static_cast<size_t>(index)].data());
  view.values = static_cast<float*>(values_[static_cast<size_t>(index)].data());
  view.block_size = shape_.block_size;
  view.num_kv_heads = shape_.num_kv_heads;
  view.head_dim = shape_.head_dim;
  return view;
}

int32_t KvCache::allocate() {
  if (free_.empty()) return -1;
  int32_t block = free_.back();
  free_.pop_back();
  return block;
}

void KvCache::release(int32_t block) {
  free_.push_back(block);
}

void SequenceBlocks::reserve(KvCache& cache, int64_t tokens) {
  int block_size = cache.shape().block_size;
  while (static_cast<int64_t>(blocks_.size()) * block_size < tokens) {
    int32_t block = cache.allocate();
    if (block < 0) {
      fail("KV cache exhausted: {} tokens need {} blocks of {} but the cache has {}", tokens,
           (tokens + block_size - 1) / block_size, block_size, cache.num_blocks());
    }
    blocks_.push_back(block);
  }
}

void SequenceBlocks::release_all(KvCache& cache) {
  for (int32_t block : blocks_) cache.release(block);
  blocks_.clear();
}

int64_t SequenceBlocks::slot(int64_t position, int block_size) const {
  return static_cast<int64_t>(blocks_[static_cast<size_t>(position / block_size)]) * block_size +
         position % block_size;
}

}  // namespace deepinfer
