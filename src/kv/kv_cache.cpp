#include "kv/kv_cache.h"

#include "core/error.h"

namespace deepinfer {

KvCacheShape KvCacheShape::heads(int num_layers, int num_kv_heads, int head_dim, int block_size) {
  return KvCacheShape{num_layers, num_kv_heads, head_dim, head_dim, block_size, false};
}

int64_t KvCacheShape::floats_per_token_layer() const {
  int64_t keys = int64_t{num_kv_heads} * key_dim;
  return values_in_keys ? keys : keys + int64_t{num_kv_heads} * value_dim;
}

size_t KvCacheShape::bytes_per_token() const {
  return sizeof(float) * static_cast<size_t>(num_layers) *
         static_cast<size_t>(floats_per_token_layer());
}

KvCache::KvCache(const KvCacheShape& shape, int64_t num_blocks)
    : shape_(shape), num_blocks_(num_blocks) {
  DI_CHECK(num_blocks > 0, "KV cache needs at least one block");
  DI_CHECK(!shape.values_in_keys || shape.value_dim <= shape.key_dim,
           "KV cache: values inside keys need value_dim <= key_dim");
  auto slots = static_cast<size_t>(num_blocks) * static_cast<size_t>(shape.block_size);
  size_t key_bytes = sizeof(float) * slots * static_cast<size_t>(shape.num_kv_heads) *
                     static_cast<size_t>(shape.key_dim);
  size_t value_bytes = sizeof(float) * slots * static_cast<size_t>(shape.num_kv_heads) *
                       static_cast<size_t>(shape.value_dim);
  for (int layer = 0; layer < shape.num_layers; ++layer) {
    keys_.emplace_back(key_bytes);
    values_.emplace_back(shape.values_in_keys ? 0 : value_bytes);
  }
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t block = num_blocks - 1; block >= 0; --block)
    free_.push_back(static_cast<int32_t>(block));
}

PagedKvView KvCache::layer(int index) const {
  PagedKvView view;
  view.keys = static_cast<float*>(keys_[static_cast<size_t>(index)].data());
  view.values = shape_.values_in_keys
                    ? view.keys
                    : static_cast<float*>(values_[static_cast<size_t>(index)].data());
  view.block_size = shape_.block_size;
  view.num_kv_heads = shape_.num_kv_heads;
  view.key_dim = shape_.key_dim;
  view.value_dim = shape_.value_dim;
  view.values_in_keys = shape_.values_in_keys;
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
