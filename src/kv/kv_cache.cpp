#include "kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "core/error.h"

namespace deepinfer {

KvCacheShape KvCacheShape::heads(int num_layers, int num_kv_heads, int head_dim, int block_size) {
  return KvCacheShape{num_layers, num_kv_heads, head_dim, head_dim,
                      block_size, false,        {},       DType::kF32};
}

int64_t KvCacheShape::floats_per_token_layer() const {
  int64_t keys = int64_t{num_kv_heads} * key_dim;
  return values_in_keys ? keys : keys + int64_t{num_kv_heads} * value_dim;
}

size_t KvCacheShape::bytes_per_token() const {
  return dtype_size(dtype) * static_cast<size_t>(num_layers) *
         static_cast<size_t>(floats_per_token_layer());
}

size_t KvCacheShape::bytes_per_context_token() const {
  size_t full = 0;
  for (int layer = 0; layer < num_layers; ++layer)
    full += layer_window.empty() || layer_window[static_cast<size_t>(layer)] == 0 ? 1 : 0;
  return dtype_size(dtype) * full * static_cast<size_t>(floats_per_token_layer());
}

double KvCacheShape::bytes_at_context(int64_t context) const {
  double tokens = 0.0;
  for (int layer = 0; layer < num_layers; ++layer) {
    int window = layer_window.empty() ? 0 : layer_window[static_cast<size_t>(layer)];
    tokens += static_cast<double>(window > 0 ? std::min<int64_t>(window, context) : context);
  }
  return tokens * static_cast<double>(dtype_size(dtype)) *
         static_cast<double>(floats_per_token_layer());
}

size_t KvCacheShape::bytes_per_block() const {
  return dtype_size(dtype) * static_cast<size_t>(groups().layers_per_page) *
         static_cast<size_t>(floats_per_token_layer()) * static_cast<size_t>(block_size);
}

KvGroupLayout KvGroupLayout::of(const std::vector<int>& layer_window, int num_layers) {
  std::vector<int> windows =
      layer_window.empty() ? std::vector<int>(static_cast<size_t>(num_layers), 0) : layer_window;
  DI_CHECK(static_cast<int>(windows.size()) == num_layers,
           "KV cache: {} layer windows for {} layers", windows.size(), num_layers);
  std::vector<int> kinds;  // windows in order of first appearance
  std::map<int, std::vector<int>> layers_of;
  for (int layer = 0; layer < num_layers; ++layer) {
    int window = windows[static_cast<size_t>(layer)];
    if (!layers_of.count(window)) kinds.push_back(window);
    layers_of[window].push_back(layer);
  }
  KvGroupLayout layout;
  for (int window : kinds)
    layout.layers_per_page =
        std::gcd(layout.layers_per_page, static_cast<int>(layers_of[window].size()));
  layout.layer_group.resize(static_cast<size_t>(num_layers));
  layout.layer_slot.resize(static_cast<size_t>(num_layers));
  for (int window : kinds) {
    const std::vector<int>& layers = layers_of[window];
    for (size_t i = 0; i < layers.size(); ++i) {
      if (i % static_cast<size_t>(layout.layers_per_page) == 0)
        layout.group_window.push_back(window);
      layout.layer_group[static_cast<size_t>(layers[i])] = layout.num_groups() - 1;
      layout.layer_slot[static_cast<size_t>(layers[i])] =
          static_cast<int>(i % static_cast<size_t>(layout.layers_per_page));
    }
  }
  return layout;
}

KvCache::KvCache(const KvCacheShape& shape, int64_t num_blocks)
    : KvCache(shape, num_blocks, host_memory) {}

KvCache::KvCache(const KvCacheShape& shape, int64_t num_blocks, Ops& ops)
    : KvCache(shape, num_blocks, [&ops](size_t bytes) { return ops.allocate(bytes); }) {
  ops_ = &ops;
}

std::vector<std::pair<std::byte*, size_t>> KvCache::block_ranges(int32_t block) const {
  DI_CHECK(block > 0 && block < num_blocks_, "KV cache: block {} of {}", block, num_blocks_);
  const size_t element = dtype_size(shape_.dtype);
  const size_t slots = static_cast<size_t>(shape_.block_size);
  const size_t key_bytes = element * slots * static_cast<size_t>(shape_.num_kv_heads) *
                           static_cast<size_t>(shape_.key_dim);
  const size_t value_bytes = element * slots * static_cast<size_t>(shape_.num_kv_heads) *
                             static_cast<size_t>(shape_.value_dim);
  std::vector<std::pair<std::byte*, size_t>> ranges;
  for (size_t slot = 0; slot < keys_.size(); ++slot) {
    auto* keys = static_cast<std::byte*>(keys_[slot].get());
    ranges.emplace_back(keys + static_cast<size_t>(block) * key_bytes, key_bytes);
    if (!shape_.values_in_keys) {
      auto* values = static_cast<std::byte*>(values_[slot].get());
      ranges.emplace_back(values + static_cast<size_t>(block) * value_bytes, value_bytes);
    }
  }
  return ranges;
}

// A device's blocks move through one staging block in its memory: the block's ranges (a page
// per layer slot) are gathered or scattered there by device copies, and host memory sees one
// copy of the whole payload instead of one small, synchronising copy per range.
std::byte* KvCache::staging() const {
  if (!ops_ || ops_->device() == Device::kCpu) return nullptr;
  if (!staging_) staging_ = ops_->allocate_scratch(shape_.bytes_per_block());
  return static_cast<std::byte*>(staging_.get());
}

void KvCache::read_block(int32_t block, std::span<std::byte> out) const {
  DI_CHECK(out.size() == shape_.bytes_per_block(), "read_block: {} bytes for a block of {}",
           out.size(), shape_.bytes_per_block());
  std::byte* staged = staging();
  size_t offset = 0;
  for (auto [address, bytes] : block_ranges(block)) {
    if (staged) {
      ops_->copy_within(staged + offset, address, bytes);
    } else {
      std::memcpy(out.data() + offset, address, bytes);
    }
    offset += bytes;
  }
  if (staged) ops_->to_host(out.data(), staged, out.size());
}

void KvCache::write_block(int32_t block, std::span<const std::byte> bytes_in) {
  DI_CHECK(bytes_in.size() == shape_.bytes_per_block(), "write_block: {} bytes for a block of {}",
           bytes_in.size(), shape_.bytes_per_block());
  std::byte* staged = staging();
  if (staged) ops_->to_backend(staged, bytes_in.data(), bytes_in.size());
  size_t offset = 0;
  for (auto [address, bytes] : block_ranges(block)) {
    if (staged) {
      ops_->copy_within(address, staged + offset, bytes);
    } else {
      std::memcpy(address, bytes_in.data() + offset, bytes);
    }
    offset += bytes;
  }
}

KvCache::KvCache(const KvCacheShape& shape, int64_t num_blocks,
                 const std::function<BackendMemory(size_t)>& allocate)
    : shape_(shape), groups_(shape.groups()), num_blocks_(num_blocks), pool_(num_blocks) {
  DI_CHECK(!shape.values_in_keys || shape.value_dim <= shape.key_dim,
           "KV cache: values inside keys need value_dim <= key_dim");
  auto slots = static_cast<size_t>(num_blocks) * static_cast<size_t>(shape.block_size);
  size_t key_bytes = dtype_size(shape.dtype) * slots * static_cast<size_t>(shape.num_kv_heads) *
                     static_cast<size_t>(shape.key_dim);
  size_t value_bytes = dtype_size(shape.dtype) * slots * static_cast<size_t>(shape.num_kv_heads) *
                       static_cast<size_t>(shape.value_dim);
  // One buffer per page slot: layer l uses slot layer_slot[l] of its group's blocks.
  for (int slot = 0; slot < groups_.layers_per_page; ++slot) {
    keys_.push_back(allocate(key_bytes));
    values_.push_back(shape.values_in_keys ? nullptr : allocate(value_bytes));
  }
}

PagedKvView KvCache::layer(int index) const {
  auto slot = static_cast<size_t>(groups_.layer_slot[static_cast<size_t>(index)]);
  PagedKvView view;
  view.keys = keys_[slot].get();
  view.values = shape_.values_in_keys ? view.keys : values_[slot].get();
  view.dtype = shape_.dtype;
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

void SequenceBlocks::publish_full_blocks(KvCache& cache, std::span<const int32_t> tokens,
                                         int64_t computed, uint64_t salt, int group) {
  int block_size = cache.shape().block_size;
  auto full = static_cast<size_t>(std::min<int64_t>(computed, static_cast<int64_t>(tokens.size())) /
                                  block_size);
  full = std::min(full, blocks_.size());
  for (size_t i = hashes_.size(); i < full; ++i) {
    if (blocks_[i] == BlockPool::kNullBlock) break;  // left the window before it was published
    auto content =
        tokens.subspan(i * static_cast<size_t>(block_size), static_cast<size_t>(block_size));
    BlockHash hash = block_hash(hashes_.empty() ? 0 : hashes_.back(), content, salt);
    cache.pool().publish(blocks_[i], hash, content, salt, group);
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
  restored_end_ = 0;
}

int64_t SequenceBlocks::blocks_missing(int64_t tokens, int block_size) const {
  int64_t needed = (tokens + block_size - 1) / block_size;
  return std::max<int64_t>(0, needed - static_cast<int64_t>(blocks_.size()));
}

void SequenceBlocks::adopt(std::vector<int32_t> blocks, std::vector<BlockHash> hashes,
                           int64_t restored_end) {
  DI_CHECK(blocks_.empty(), "adopt: the sequence already holds blocks");
  blocks_ = std::move(blocks);
  hashes_ = std::move(hashes);
  restored_end_ = restored_end;
}

int64_t SequenceBlocks::slot(int64_t position, int block_size) const {
  if (position < restored_end_) return -1;
  return static_cast<int64_t>(blocks_[static_cast<size_t>(position / block_size)]) * block_size +
         position % block_size;
}

int64_t first_block_read(int64_t position, int window, int block_size) {
  return window > 0 ? std::max<int64_t>(0, position - window + 1) / block_size : 0;
}

uint64_t group_salt(uint64_t salt, int group) {
  return group == 0 ? salt : salt ^ (0xc2b2ae3d27d4eb4full * static_cast<uint64_t>(group));
}

namespace {

std::span<const int32_t> block_tokens(std::span<const int32_t> tokens, size_t block,
                                      int block_size) {
  return tokens.subspan(block * static_cast<size_t>(block_size), static_cast<size_t>(block_size));
}

}  // namespace

PrefixKeys prefix_keys(const KvGroupLayout& layout, int block_size, std::span<const int32_t> tokens,
                       uint64_t salt) {
  size_t usable = tokens.empty() ? 0 : (tokens.size() - 1) / static_cast<size_t>(block_size);
  PrefixKeys prefix;
  prefix.keys.resize(static_cast<size_t>(layout.num_groups()));
  for (size_t g = 0; g < prefix.keys.size(); ++g) {
    BlockHash parent = 0;
    for (size_t b = 0; b < usable; ++b) {
      parent = block_hash(parent, block_tokens(tokens, b, block_size),
                          group_salt(salt, static_cast<int>(g)));
      prefix.keys[g].push_back(parent);
    }
  }
  return prefix;
}

int64_t full_attention_prefix_blocks(const KvGroupLayout& layout, int64_t blocks,
                                     const std::function<bool(int group, int64_t block)>& present) {
  int64_t count = blocks;
  for (int g = 0; g < layout.num_groups(); ++g) {
    if (layout.group_window[static_cast<size_t>(g)] > 0) continue;
    int64_t found = 0;
    while (found < count && present(g, found)) ++found;
    count = found;
  }
  return count;
}

bool has_full_attention_group(const KvGroupLayout& layout) {
  return std::find(layout.group_window.begin(), layout.group_window.end(), 0) !=
         layout.group_window.end();
}

int64_t usable_prefix_blocks(const KvGroupLayout& layout, int block_size, int64_t blocks,
                             const std::function<bool(int group, int64_t block)>& present) {
  int64_t count = full_attention_prefix_blocks(layout, blocks, present);
  for (; count > 0; --count) {
    bool usable = true;
    for (int g = 0; g < layout.num_groups() && usable; ++g) {
      int window = layout.group_window[static_cast<size_t>(g)];
      if (window == 0) continue;
      for (int64_t b = first_block_read(count * block_size, window, block_size);
           b < count && usable; ++b)
        usable = present(g, b);
    }
    if (usable) break;
  }
  return count;
}

void SequenceKv::ensure_groups(const KvCache& cache) {
  if (groups_.empty()) groups_.resize(static_cast<size_t>(cache.groups().num_groups()));
}

void SequenceKv::reserve(KvCache& cache, int64_t tokens) {
  ensure_groups(cache);
  for (SequenceBlocks& group : groups_) group.reserve(cache, tokens);
}

bool SequenceKv::try_reserve(KvCache& cache, int64_t tokens) {
  ensure_groups(cache);
  int64_t missing = 0;
  for (const SequenceBlocks& group : groups_)
    missing += group.blocks_missing(tokens, cache.shape().block_size);
  if (missing > cache.free_blocks()) return false;
  reserve(cache, tokens);
  return true;
}

int64_t SequenceKv::take_cached_prefix(KvCache& cache, std::span<const int32_t> tokens,
                                       uint64_t salt, int64_t replay_tokens) {
  ensure_groups(cache);
  DI_CHECK(empty(), "take_cached_prefix: the sequence already holds blocks");
  const KvGroupLayout& layout = cache.groups();
  const int block_size = cache.shape().block_size;
  PrefixKeys prefix = prefix_keys(layout, block_size, tokens, salt);
  auto in_memory = [&](int group, int64_t block) {
    return cache.pool().find_cached(
               prefix.keys[static_cast<size_t>(group)][static_cast<size_t>(block)],
               block_tokens(tokens, static_cast<size_t>(block), block_size)) >= 0;
  };
  int64_t count = usable_prefix_blocks(layout, block_size, prefix.blocks(), in_memory);
  // A replay needs something restored: a layout of sliding groups only always has them kept.
  int64_t restored = replay_tokens > 0 && has_full_attention_group(layout)
                         ? full_attention_prefix_blocks(layout, prefix.blocks(), in_memory)
                         : 0;
  const int64_t replay_start = std::max<int64_t>(0, restored * block_size - replay_tokens);
  const bool replay = replay_start > count * block_size;
  cache.pool().record_lookup(prefix.blocks(), replay ? restored : count);
  auto take = [&](size_t g, int64_t first, int64_t end) {
    std::vector<int32_t> blocks(static_cast<size_t>(end), BlockPool::kNullBlock);
    for (int64_t b = first; b < end; ++b) {
      blocks[static_cast<size_t>(b)] =
          cache.pool().take_cached(prefix.keys[g][static_cast<size_t>(b)],
                                   block_tokens(tokens, static_cast<size_t>(b), block_size));
    }
    prefix.keys[g].resize(static_cast<size_t>(end));
    return blocks;
  };
  if (replay) {
    std::vector<std::vector<int32_t>> blocks(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g)
      if (layout.group_window[g] == 0) blocks[g] = take(g, 0, restored);
    adopt_replay(cache, {replay_start, restored * block_size}, std::move(blocks),
                 std::move(prefix.keys));
    return replay_start;
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<int32_t> blocks =
        take(g, first_block_read(count * block_size, layout.group_window[g], block_size), count);
    groups_[g].adopt(std::move(blocks), std::move(prefix.keys[g]));
  }
  return count * block_size;
}

void SequenceKv::adopt_replay(const KvCache& cache, const PrefixReplay& replay,
                              std::vector<std::vector<int32_t>> restored,
                              std::vector<std::vector<BlockHash>> keys) {
  ensure_groups(cache);
  DI_CHECK(empty(), "adopt_replay: the sequence already holds blocks");
  const KvGroupLayout& layout = cache.groups();
  const int block_size = cache.shape().block_size;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (layout.group_window[g] == 0) {
      keys[g].resize(restored[g].size());
      groups_[g].adopt(std::move(restored[g]), std::move(keys[g]), replay.restored_end);
    } else {
      // Nothing before the replay's first block; it computes from there on. The chain's keys
      // up to the first block the replay fills whole stay, so the blocks it completes are
      // published under the keys a later prompt with this prefix looks up.
      const auto skipped = static_cast<size_t>(replay.start / block_size);
      const auto keyed = static_cast<size_t>((replay.start + block_size - 1) / block_size);
      if (keys[g].size() >= keyed) {
        keys[g].resize(keyed);
      } else {
        keys[g].clear();  // no chain to continue: nothing of this group is published
      }
      groups_[g].adopt(std::vector<int32_t>(skipped, BlockPool::kNullBlock), std::move(keys[g]));
    }
  }
  replay_ = replay;
}

void SequenceKv::publish_full_blocks(KvCache& cache, std::span<const int32_t> tokens,
                                     int64_t computed, uint64_t salt) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].publish_full_blocks(cache, tokens, computed, group_salt(salt, static_cast<int>(g)),
                                   static_cast<int>(g));
  }
}

void SequenceKv::release_out_of_window(KvCache& cache, int64_t next_position) {
  const KvGroupLayout& layout = cache.groups();
  for (size_t g = 0; g < groups_.size(); ++g) {
    int window = layout.group_window[g];
    if (window > 0) groups_[g].release_before(cache, next_position - window + 1);
  }
}

void SequenceKv::release_all(KvCache& cache) {
  for (SequenceBlocks& group : groups_) group.release_all(cache);
  replay_ = {};
}

}  // namespace deepinfer
