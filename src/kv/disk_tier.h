// The disk tier of the prefix cache: a directory of block files (kv/block_file.h) that any
// number of processes may share. Writes go through a bounded queue to background threads, so
// the caller never waits for the disk; a full queue drops the write (counted). Loads check
// every file and remove (and count) what must not be served. A capacity bound evicts the
// least recently used files of this model (each write rescans this model's folder, which is
// fine for thousands of files; a running estimate is the step after).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "kv/block_file.h"
#include "kv/block_pool.h"

namespace deepinfer {

struct DiskTierOptions {
  std::filesystem::path dir;
  uint64_t fingerprint = 0;     // model_fingerprint of the model and KV layout
  uint64_t capacity_bytes = 0;  // 0: unbounded
  int io_threads = 2;
  size_t queue_limit = 256;  // blocks waiting to be written
  // How often a background sweep deletes expired blocks (0: only when capacity needs it).
  std::chrono::seconds sweep_interval{60};
};

struct DiskTierStats {
  int64_t written = 0;
  int64_t write_failures = 0;
  int64_t dropped_writes = 0;  // the queue was full
  int64_t loaded = 0;
  int64_t missing = 0;
  int64_t rejected[5] = {};        // by BlockFileStatus: truncated, corrupt, foreign (others 0)
  int64_t evicted = 0;             // removed for capacity, least recently used first
  int64_t expired = 0;             // removed by a sweep: unused for longer than their retention
  int64_t stale_temporaries = 0;   // half-written files of writers that died
  int64_t already_stored = 0;      // offered blocks whose file another writer made first
  int64_t retention_extended = 0;  // stored files rewritten for a longer retention asked later
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
};

class DiskTier {
 public:
  explicit DiskTier(DiskTierOptions options);
  // Writes what is queued, then stops the threads.
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Queues a full block for writing, to be kept `retention_seconds` after its last use (0:
  // until capacity needs the space); false (and counted) when the queue is full. A block
  // already stored keeps the longer of its file's retention and this one (the file is
  // rewritten whole for a longer one).
  bool offer(BlockHash key, uint64_t salt_hash, std::vector<int32_t> tokens,
             std::vector<std::byte> payload, uint32_t retention_seconds = 0);
  // The block's payload when its file is present and passes every check; a file that fails
  // one is removed. `retention_seconds`, when given, receives the retention the file holds.
  std::optional<std::vector<std::byte>> load(BlockHash key, uint64_t salt_hash,
                                             std::span<const int32_t> tokens, size_t payload_bytes,
                                             uint32_t* retention_seconds = nullptr);
  // Whether a file for the block is present (not whether it passes the checks: load() says).
  bool contains(BlockHash key) const;
  // Deletes this model's blocks unused for longer than their retention at `now`, files that
  // fail their header checks, and temporary files older than an hour (a writer that died).
  void sweep(std::filesystem::file_time_type now);
  // Waits until everything queued so far is written (or has failed).
  void flush();
  DiskTierStats stats() const;

 private:
  struct Pending {
    BlockHash key;
    uint64_t salt_hash;
    std::vector<int32_t> tokens;
    std::vector<std::byte> payload;
    uint32_t retention_seconds;
  };
  void write_loop();
  // Rewrites a stored block's file when `block` asks for a longer retention than it holds.
  bool extend_retention(const Pending& block);
  void sweep_loop();
  void enforce_capacity();
  std::filesystem::path model_folder() const;

  DiskTierOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable work_, idle_, sweep_wake_;
  std::deque<Pending> queue_;
  int busy_ = 0;
  bool stopping_ = false;
  DiskTierStats stats_;
  std::mutex eviction_;
  std::chrono::steady_clock::time_point last_sweep_{};  // under eviction_
  std::vector<std::thread> threads_;
};

}  // namespace deepinfer
