#include "kv/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>

namespace deepinfer {
namespace {

struct StoredFile {
  std::filesystem::path path;
  std::filesystem::file_time_type used;
  uint64_t bytes;
};

// This model's block files (other models' folders are never touched).
std::vector<StoredFile> stored_files(const std::filesystem::path& folder) {
  std::vector<StoredFile> files;
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(folder, error);
       !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
    if (!it->is_regular_file(error) || it->path().extension() != ".kvb") continue;
    auto bytes = it->file_size(error);
    auto used = it->last_write_time(error);
    if (!error) files.push_back({it->path(), used, bytes});
  }
  return files;
}

}  // namespace

DiskTier::DiskTier(DiskTierOptions options) : options_(std::move(options)) {
  for (int i = 0; i < std::max(1, options_.io_threads); ++i)
    threads_.emplace_back([this] { write_loop(); });
  if (options_.sweep_interval.count() > 0) threads_.emplace_back([this] { sweep_loop(); });
}

DiskTier::~DiskTier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  sweep_wake_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

bool DiskTier::offer(BlockHash key, uint64_t salt_hash, std::vector<int32_t> tokens,
                     std::vector<std::byte> payload, uint32_t retention_seconds) {
  {
    std::lock_guard lock(mutex_);
    if (queue_.size() >= options_.queue_limit) {
      ++stats_.dropped_writes;
      return false;
    }
    queue_.push_back({key, salt_hash, std::move(tokens), std::move(payload), retention_seconds});
  }
  work_.notify_one();
  return true;
}

void DiskTier::write_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued is written
    Pending block = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    lock.unlock();
    if (contains(block.key)) {  // the same key means the same tokens, salt and model
      const bool extended = extend_retention(block);
      lock.lock();
      --busy_;
      ++stats_.already_stored;
      stats_.retention_extended += extended;
      if (queue_.empty() && busy_ == 0) idle_.notify_all();
      continue;
    }
    bool written =
        write_block_file(options_.dir, {options_.fingerprint, block.key, block.salt_hash},
                         block.tokens, block.payload, block.retention_seconds);
    if (written && options_.capacity_bytes > 0) enforce_capacity();
    lock.lock();
    --busy_;
    if (written) {
      ++stats_.written;
      stats_.bytes_written += block.payload.size();
    } else {
      ++stats_.write_failures;
    }
    if (queue_.empty() && busy_ == 0) idle_.notify_all();
  }
}

bool DiskTier::extend_retention(const Pending& block) {
  std::optional<uint32_t> kept =
      block_file_retention(block_file_path(options_.dir, options_.fingerprint, block.key));
  if (!kept || !retention_outlasts(block.retention_seconds, *kept)) return false;
  return write_block_file(options_.dir, {options_.fingerprint, block.key, block.salt_hash},
                          block.tokens, block.payload, block.retention_seconds);
}

std::filesystem::path DiskTier::model_folder() const {
  return block_file_path(options_.dir, options_.fingerprint, 0).parent_path().parent_path();
}

void DiskTier::sweep_loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    sweep_wake_.wait_for(lock, options_.sweep_interval, [&] { return stopping_; });
    if (stopping_) return;
    lock.unlock();
    sweep(std::filesystem::file_time_type::clock::now());
    lock.lock();
  }
}

void DiskTier::sweep(std::filesystem::file_time_type now) {
  std::lock_guard lock(eviction_);
  last_sweep_ = std::chrono::steady_clock::now();
  int64_t expired = 0, stale = 0, bad = 0;
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(model_folder(), error);
       !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
    std::error_code file_error;
    if (!it->is_regular_file(file_error)) continue;
    auto unused = now - it->last_write_time(file_error);
    if (file_error) continue;
    const std::filesystem::path& path = it->path();
    bool remove = false;
    if (path.extension() == ".tmp") {
      remove = unused > std::chrono::hours(1);
      stale += remove;
    } else if (path.extension() == ".kvb") {
      std::optional<uint32_t> retention = block_file_retention(path);
      remove = !retention || (*retention > 0 && unused > std::chrono::seconds(*retention));
      (retention ? expired : bad) += remove;
    }
    if (remove) std::filesystem::remove(path, file_error);
  }
  std::lock_guard stats_lock(mutex_);
  stats_.expired += expired;
  stats_.stale_temporaries += stale;
  stats_.rejected[static_cast<int>(BlockFileStatus::kCorrupt)] += bad;
}

// Expired blocks go first, then the least recently used.
void DiskTier::enforce_capacity() {
  auto total_bytes = [&](const std::vector<StoredFile>& files) {
    uint64_t total = 0;
    for (const StoredFile& file : files) total += file.bytes;
    return total;
  };
  if (total_bytes(stored_files(model_folder())) <= options_.capacity_bytes) return;
  // A sweep reads every file's header: at most one a minute on the write path.
  bool swept_lately;
  {
    std::lock_guard lock(eviction_);
    swept_lately = std::chrono::steady_clock::now() - last_sweep_ < std::chrono::minutes(1);
  }
  if (!swept_lately) sweep(std::filesystem::file_time_type::clock::now());
  std::lock_guard lock(eviction_);
  std::vector<StoredFile> files = stored_files(model_folder());
  uint64_t total = total_bytes(files);
  if (total <= options_.capacity_bytes) return;
  // Least recently used first: loads refresh a file's time, so it is use, not age.
  std::sort(files.begin(), files.end(),
            [](const StoredFile& a, const StoredFile& b) { return a.used < b.used; });
  int64_t evicted = 0;
  std::error_code error;
  for (const StoredFile& file : files) {
    if (total <= options_.capacity_bytes) break;
    if (std::filesystem::remove(file.path, error)) ++evicted;
    total -= file.bytes;  // gone, whether this process or another removed it
  }
  std::lock_guard stats_lock(mutex_);
  stats_.evicted += evicted;
}

std::optional<std::vector<std::byte>> DiskTier::load(BlockHash key, uint64_t salt_hash,
                                                     std::span<const int32_t> tokens,
                                                     size_t payload_bytes,
                                                     uint32_t* retention_seconds) {
  std::filesystem::path file = block_file_path(options_.dir, options_.fingerprint, key);
  BlockFileContents contents =
      read_block_file(file, {options_.fingerprint, key, salt_hash}, tokens, payload_bytes);
  std::lock_guard lock(mutex_);
  if (contents.status == BlockFileStatus::kOk) {
    ++stats_.loaded;
    stats_.bytes_read += contents.payload.size();
    ::utimensat(AT_FDCWD, file.c_str(), nullptr, 0);  // now used: last to be evicted
    if (retention_seconds) *retention_seconds = contents.retention_seconds;
    return std::move(contents.payload);
  }
  if (contents.status == BlockFileStatus::kMissing) {
    ++stats_.missing;
    return std::nullopt;
  }
  // Never served, and not left for the next reader to trip over.
  ++stats_.rejected[static_cast<int>(contents.status)];
  std::error_code error;
  std::filesystem::remove(file, error);
  return std::nullopt;
}

bool DiskTier::contains(BlockHash key) const {
  std::error_code error;
  return std::filesystem::is_regular_file(block_file_path(options_.dir, options_.fingerprint, key),
                                          error);
}

void DiskTier::flush() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && busy_ == 0; });
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace deepinfer
