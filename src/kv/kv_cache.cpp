#include "kv/kv_cache.h"

#include <algorithm>

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
    : shape_(shape), num_blocks_(num_blocks), pool_(num_blocks) {
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

bool SequenceBlocks::try_reserve(KvCache& cache, int64_t tokens) {
  int block_size = cache.shape().block_size;
  auto needed = static_cast<size_t>((tokens + block_size - 1) / block_size);
  if (needed <= blocks_.size()) return true;
  if (static_cast<int64_t>(needed - blocks_.size()) > cache.free_blocks()) return false;
  reserve(cache, tokens);
  return true;
}

int64_t SequenceBlocks::take_cached_prefix(KvCache& cache, std::span<const int32_t> tokens,
                                           uint64_t salt) {
  DI_CHECK(blocks_.empty(), "take_cached_prefix: the sequence already holds blocks");
  int block_size = cache.shape().block_size;
  auto usable = tokens.empty() ? 0 : (tokens.size() - 1) / static_cast<size_t>(block_size);
  BlockHash parent = 0;
  for (size_t i = 0; i < usable; ++i) {
    auto content =
        tokens.subspan(i * static_cast<size_t>(block_size), static_cast<size_t>(block_size));
    BlockHash hash = block_hash(parent, content, salt);
    int32_t block = cache.pool().take_cached(hash, content);
    if (block < 0) break;
    blocks_.push_back(block);
    hashes_.push_back(hash);
    parent = hash;
  }
  return static_cast<int64_t>(blocks_.size()) * block_size;
}

void SequenceBlocks::publish_full_blocks(KvCache& cache, std::span<const int32_t> tokens,
                                         int64_t computed, uint64_t salt) {
  int block_size = cache.shape().block_size;
  auto full = static_cast<size_t>(std::min<int64_t>(computed, static_cast<int64_t>(tokens.size())) /
                                  block_size);
  full = std::min(full, blocks_.size());
  for (size_t i = hashes_.size(); i < full; ++i) {
    if (blocks_[i] == BlockPool::kNullBlock) break;  // left the window before it was published
    auto content =
        tokens.subspan(i * static_cast<size_t>(block_size), static_cast<size_t>(block_size));
    BlockHash hash = block_hash(hashes_.empty() ? 0 : hashes_.back(), content, salt);
    cache.pool().publish(blocks_[i], hash, content);
    hashes_.push_back(hash);
  }
}

void SequenceBlocks::release_before(KvCache& cache, int64_t first_needed) {
  int block_size = cache.shape().block_size;
  auto whole = static_cast<size_t>(std::max<int64_t>(0, first_needed) / block_size);
  for (size_t i = 0; i < std::min(whole, blocks_.size()); ++i) {
    if (blocks_[i] == BlockPool::kNullBlock) continue;
    cache.release(blocks_[i]);
    blocks_[i] = BlockPool::kNullBlock;
  }
}

void SequenceBlocks::release_all(KvCache& cache) {
  for (int32_t block : blocks_) cache.release(block);
  blocks_.clear();
  hashes_.clear();
}

int64_t SequenceBlocks::slot(int64_t position, int block_size) const {
  return static_cast<int64_t>(blocks_[static_cast<size_t>(position / block_size)]) * block_size +
         position % block_size;
}

}  // namespace deepinfer
