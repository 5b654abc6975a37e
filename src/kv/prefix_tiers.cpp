#include "kv/prefix_tiers.h"

#include <algorithm>

namespace deepinfer {
namespace {

std::span<const int32_t> tokens_of_block(std::span<const int32_t> tokens, int64_t block,
                                         int block_size) {
  return tokens.subspan(static_cast<size_t>(block * block_size), static_cast<size_t>(block_size));
}

}  // namespace

PrefixTiers::PrefixTiers(KvCache& cache, PrefixTierOptions options)
    : cache_(cache), options_(std::move(options)) {
  if (options_.host_bytes > 0) {
    host_.emplace(options_.host_bytes, cache_.shape().bytes_per_block(),
                  [&cache](size_t bytes) { return cache.allocate_host(bytes); });
  }
  if (options_.disk) disk_.emplace(*options_.disk);
  for (int i = 0; i < std::max(1, options_.fetch_threads); ++i)
    threads_.emplace_back([this] { fetch_loop(); });
  // A block evicted before it was offered (its request's offer found the queue full) keeps
  // what its requests asked for; one nobody asked for gets the default class's.
  cache_.pool().set_eviction_hook([this](int32_t block) {
    const BlockPool& pool = cache_.pool();
    if (stored(pool.group_of(block)))
      offer(block, pool.retention_of(block).value_or(options_.evicted_retention_seconds));
  });
}

bool PrefixTiers::stored(int group) const {
  return options_.keep_windows || cache_.groups().group_window[static_cast<size_t>(group)] == 0;
}

int64_t PrefixTiers::usable(int64_t blocks,
                            const std::function<bool(int group, int64_t block)>& present) const {
  if (options_.keep_windows)
    return usable_prefix_blocks(cache_.groups(), cache_.shape().block_size, blocks, present);
  return full_attention_prefix_blocks(cache_.groups(), blocks, present);
}

PrefixTiers::~PrefixTiers() {
  cache_.pool().set_eviction_hook(nullptr);
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

bool PrefixTiers::offer(int32_t block, uint32_t retention_seconds) {
  BlockPool& pool = cache_.pool();
  const size_t bytes = cache_.shape().bytes_per_block();
  // The block goes straight into a host slot (page-locked on a GPU), and from there to the
  // disk's queue; without a slot, into memory of the disk's own.
  std::shared_ptr<std::byte> slot = host_ ? host_->reserve() : nullptr;
  std::vector<std::byte> payload;
  if (slot) {
    cache_.read_block(block, {slot.get(), bytes});
    if (disk_) payload.assign(slot.get(), slot.get() + bytes);
    host_->put(pool.key_of(block), pool.salt_of(block), pool.tokens_of(block), std::move(slot));
  } else if (disk_) {
    payload.resize(bytes);
    cache_.read_block(block, payload);
  } else {
    return true;  // every host slot is being read: eviction offers the block again
  }
  if (disk_) {
    if (!disk_->offer(pool.key_of(block), pool.salt_of(block), pool.tokens_of(block),
                      std::move(payload), retention_seconds))
      return false;
    std::lock_guard lock(mutex_);
    ++stats_.offered_blocks;
  }
  pool.mark_persisted(block, retention_seconds);
  return true;
}

void PrefixTiers::offload(const SequenceKv& kv, std::span<const int32_t> tokens,
                          uint32_t retention_seconds) {
  BlockPool& pool = cache_.pool();
  const int block_size = cache_.shape().block_size;
  bool queue_full = false;
  for (int g = 0; g < kv.num_groups(); ++g) {
    if (!stored(g)) continue;
    const SequenceBlocks& blocks = kv.group(g);
    const size_t keyed = std::min(blocks.keys().size(), blocks.table().size());
    for (size_t i = 0; i < keyed; ++i) {
      int32_t block = blocks.table()[i];
      if (block == BlockPool::kNullBlock) {
        block = pool.find_cached(blocks.keys()[i],
                                 tokens_of_block(tokens, static_cast<int64_t>(i), block_size));
      }
      // A block whose content was published first elsewhere is that block's to offer.
      if (block <= BlockPool::kNullBlock || !pool.is_cached(block)) continue;
      pool.want_retention(block, retention_seconds);
      if (pool.is_persisted(block) || queue_full) continue;
      // A full queue drops the rest now; eviction offers them later with what was asked.
      queue_full = !offer(block, *pool.retention_of(block));
    }
  }
}

uint64_t PrefixTiers::start_fetch(std::span<const int32_t> tokens, uint64_t salt) {
  const KvCache& cache = cache_;
  auto fetch = std::make_shared<Fetch>();
  fetch->layout = cache.groups();
  fetch->block_size = cache.shape().block_size;
  fetch->keys = prefix_keys(fetch->layout, fetch->block_size, tokens, salt);
  const int64_t blocks = fetch->keys.blocks();
  for (size_t g = 0; g < fetch->keys.keys.size(); ++g) {
    std::vector<bool>& present = fetch->in_memory.emplace_back(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) {
      present[static_cast<size_t>(b)] =
          cache.pool().find_cached(fetch->keys.keys[g][static_cast<size_t>(b)],
                                   tokens_of_block(tokens, b, fetch->block_size)) >= 0;
    }
  }
  // Nothing to fetch when memory alone holds the whole usable prefix (a sliding group's
  // blocks before its window are not needed for that).
  auto in_memory = [&](int g, int64_t b) {
    return fetch->in_memory[static_cast<size_t>(g)][static_cast<size_t>(b)];
  };
  if (usable(blocks, in_memory) == blocks) return 0;
  fetch->tokens.assign(tokens.begin(), tokens.end());
  fetch->salt = salt;
  fetch->payload_bytes = cache.shape().bytes_per_block();
  std::lock_guard lock(mutex_);
  uint64_t ticket = ++next_ticket_;
  fetches_[ticket] = fetch;
  queue_.push_back(fetch);
  work_.notify_one();
  return ticket;
}

void PrefixTiers::fetch_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    std::shared_ptr<Fetch> fetch = queue_.front();
    queue_.pop_front();
    lock.unlock();
    run(*fetch);
    lock.lock();
    fetch->done = true;
    finished_.notify_all();
  }
}

// The longest prefix memory and disk hold together, then the disk's part of it read and
// checked in block order. A block that fails its checks ends the prefix there.
void PrefixTiers::run(Fetch& fetch) {
  auto start = std::chrono::steady_clock::now();
  const int64_t blocks = fetch.keys.blocks();
  const auto groups = static_cast<int>(fetch.keys.keys.size());
  auto key = [&](int g, int64_t b) {
    return fetch.keys.keys[static_cast<size_t>(g)][static_cast<size_t>(b)];
  };
  auto in_memory = [&](int g, int64_t b) {
    return fetch.in_memory[static_cast<size_t>(g)][static_cast<size_t>(b)];
  };
  auto below = [&](int g, int64_t b) {
    return in_memory(g, b) || (host_ && host_->contains(key(g, b))) ||
           (disk_ && disk_->contains(key(g, b)));
  };
  int64_t count = usable(blocks, below);
  std::vector<Block> wanted;
  for (int g = 0; g < groups; ++g) {
    if (!stored(g)) continue;
    int window = fetch.layout.group_window[static_cast<size_t>(g)];
    for (int64_t b = first_block_read(count * fetch.block_size, window, fetch.block_size);
         b < count; ++b) {
      if (!in_memory(g, b)) wanted.push_back({g, b, key(g, b)});
    }
  }
  std::stable_sort(wanted.begin(), wanted.end(),
                   [](const Block& a, const Block& b) { return a.index < b.index; });
  int64_t limit = count, from_host = 0;
  for (const Block& block : wanted) {
    if (block.index >= limit) break;
    std::optional<uint32_t> retention;
    auto payload = load(fetch, block, retention, from_host);
    if (!payload) {
      limit = block.index;
      continue;
    }
    fetch.loaded.push_back(block);
    fetch.payloads.push_back(std::move(payload));
    fetch.retentions.push_back(retention);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard lock(mutex_);
  stats_.queried_blocks += blocks;
  stats_.found_blocks += static_cast<int64_t>(fetch.loaded.size());
  stats_.host_found_blocks += from_host;
  if (!fetch.loaded.empty()) stats_.load_seconds.observe(seconds);
}

std::shared_ptr<const std::byte> PrefixTiers::load(const Fetch& fetch, const Block& block,
                                                   std::optional<uint32_t>& retention,
                                                   int64_t& from_host) {
  const uint64_t salt = group_salt(fetch.salt, block.group);
  auto tokens = tokens_of_block(fetch.tokens, block.index, fetch.block_size);
  if (host_) {
    if (auto payload = host_->get(block.key, salt, tokens)) {
      ++from_host;
      return payload;
    }
  }
  if (!disk_) return nullptr;
  uint32_t seconds = 0;
  auto payload = disk_->load(block.key, salt, tokens, fetch.payload_bytes, &seconds);
  if (!payload) return nullptr;
  retention = seconds;
  auto owned = std::make_shared<const std::vector<std::byte>>(std::move(*payload));
  return std::shared_ptr<const std::byte>(owned, owned->data());
}

bool PrefixTiers::ready(uint64_t ticket) const {
  std::lock_guard lock(mutex_);
  auto found = fetches_.find(ticket);
  return found == fetches_.end() || found->second->done;
}

std::vector<int32_t> PrefixTiers::install(uint64_t ticket) {
  KvCache& cache = cache_;
  std::shared_ptr<Fetch> fetch;
  {
    std::lock_guard lock(mutex_);
    auto found = fetches_.find(ticket);
    if (found == fetches_.end() || !found->second->done) return {};
    fetch = found->second;
    fetches_.erase(found);
  }
  std::vector<int32_t> installed;
  BlockPool& pool = cache.pool();
  for (size_t i = 0; i < fetch->loaded.size(); ++i) {
    const Block& loaded = fetch->loaded[i];
    auto content = tokens_of_block(fetch->tokens, loaded.index, fetch->block_size);
    if (pool.find_cached(loaded.key, content) >= 0) continue;  // memory has it again
    int32_t block = cache.allocate();
    if (block < 0) break;
    cache.write_block(block, {fetch->payloads[i].get(), fetch->payload_bytes});
    pool.publish(block, loaded.key, content, group_salt(fetch->salt, loaded.group), loaded.group);
    pool.mark_persisted(block, fetch->retentions[i]);
    installed.push_back(block);
  }
  std::lock_guard lock(mutex_);
  stats_.installed_blocks += static_cast<int64_t>(installed.size());
  return installed;
}

void PrefixTiers::cancel(uint64_t ticket) {
  std::lock_guard lock(mutex_);
  fetches_.erase(ticket);  // a fetch thread running it keeps it alive until it ends
}

bool PrefixTiers::fetching() const {
  std::lock_guard lock(mutex_);
  return !fetches_.empty();
}

void PrefixTiers::wait(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  finished_.wait_for(lock, timeout, [&] {
    return std::any_of(fetches_.begin(), fetches_.end(),
                       [](const auto& entry) { return entry.second->done; });
  });
}

PrefixTierStats PrefixTiers::stats() const {
  PrefixTierStats stats;
  {
    std::lock_guard lock(mutex_);
    stats = stats_;
  }
  stats.has_host = host_.has_value();
  stats.has_disk = disk_.has_value();
  if (host_) stats.host = host_->stats();
  if (disk_) stats.disk = disk_->stats();
  return stats;
}

}  // namespace deepinfer
