// The disk tier: queued writes, checked loads, dropped writes when the queue is full, LRU
// eviction under a capacity bound, and two tiers sharing one directory.
#include "kv/disk_tier.h"

#include <gtest/gtest.h>

#include <fstream>

#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::TempDir;

std::vector<int32_t> tokens_of(int block) {
  return {block, block + 1, block + 2, block + 3};
}

std::vector<std::byte> payload_of(int block) {
  return std::vector<std::byte>(512, static_cast<std::byte>(block));
}

DiskTierOptions options_for(const TempDir& dir) {
  DiskTierOptions options;
  options.dir = dir.path();
  options.fingerprint = 42;
  return options;
}

TEST(DiskTier, WritesInTheBackgroundAndLoadsWhatPassesEveryCheck) {
  TempDir dir;
  DiskTier tier(options_for(dir));
  for (int b = 0; b < 10; ++b) EXPECT_TRUE(tier.offer(100 + b, 7, tokens_of(b), payload_of(b)));
  tier.flush();
  for (int b = 0; b < 10; ++b) {
    auto payload = tier.load(100 + b, 7, tokens_of(b), 512);
    ASSERT_TRUE(payload) << b;
    EXPECT_EQ(*payload, payload_of(b));
  }
  EXPECT_FALSE(tier.load(999, 7, tokens_of(0), 512));
  DiskTierStats stats = tier.stats();
  EXPECT_EQ(stats.written, 10);
  EXPECT_EQ(stats.loaded, 10);
  EXPECT_EQ(stats.missing, 1);
  EXPECT_EQ(stats.bytes_read, 10u * 512);
}

TEST(DiskTier, ABadFileIsCountedRemovedAndNeverServed) {
  TempDir dir;
  DiskTier tier(options_for(dir));
  ASSERT_TRUE(tier.offer(5, 7, tokens_of(1), payload_of(1)));
  tier.flush();
  auto file = block_file_path(dir.path(), 42, 5);
  std::fstream(file, std::ios::in | std::ios::out | std::ios::binary).seekp(100).put('x');
  EXPECT_FALSE(tier.load(5, 7, tokens_of(1), 512));
  EXPECT_EQ(tier.stats().rejected[static_cast<int>(BlockFileStatus::kCorrupt)], 1);
  EXPECT_FALSE(std::filesystem::exists(file));
  // A salt that is not the file's is another tenant's block: refused, removed.
  ASSERT_TRUE(tier.offer(6, 7, tokens_of(2), payload_of(2)));
  tier.flush();
  EXPECT_FALSE(tier.load(6, 8, tokens_of(2), 512));
  EXPECT_EQ(tier.stats().rejected[static_cast<int>(BlockFileStatus::kForeign)], 1);
}

TEST(DiskTier, AFullQueueDropsWritesInsteadOfWaiting) {
  TempDir dir;
  DiskTierOptions options = options_for(dir);
  options.queue_limit = 0;
  DiskTier tier(options);
  EXPECT_FALSE(tier.offer(1, 7, tokens_of(1), payload_of(1)));
  tier.flush();
  EXPECT_EQ(tier.stats().dropped_writes, 1);
  EXPECT_EQ(tier.stats().written, 0);
}

TEST(DiskTier, CapacityEvictsTheLeastRecentlyUsed) {
  TempDir dir;
  DiskTierOptions options = options_for(dir);
  options.io_threads = 1;
  DiskTier tier(options);
  for (int b = 0; b < 3; ++b) ASSERT_TRUE(tier.offer(b + 1, 7, tokens_of(b), payload_of(b)));
  tier.flush();
  const auto file_bytes = std::filesystem::file_size(block_file_path(dir.path(), 42, 1));
  // Ages set explicitly (oldest first: 1, 2, 3), then block 1 is used again.
  auto now = std::filesystem::file_time_type::clock::now();
  for (int b = 0; b < 3; ++b)
    std::filesystem::last_write_time(block_file_path(dir.path(), 42, b + 1),
                                     now - std::chrono::hours(10 - b));
  ASSERT_TRUE(tier.load(1, 7, tokens_of(0), 512));
  // A bounded tier over the same folder: its first write makes room by evicting block 2.
  DiskTierOptions bounded = options;
  bounded.capacity_bytes = 3 * file_bytes;
  DiskTier small(bounded);
  ASSERT_TRUE(small.offer(4, 7, tokens_of(3), payload_of(3)));
  small.flush();
  EXPECT_EQ(small.stats().evicted, 1);
  EXPECT_TRUE(std::filesystem::exists(block_file_path(dir.path(), 42, 1)));
  EXPECT_FALSE(std::filesystem::exists(block_file_path(dir.path(), 42, 2)));
  EXPECT_TRUE(std::filesystem::exists(block_file_path(dir.path(), 42, 3)));
  EXPECT_TRUE(std::filesystem::exists(block_file_path(dir.path(), 42, 4)));
}

// The sweep takes its clock as an argument: "now" moves without waiting days.
TEST(DiskTier, ASweepDeletesWhatOutlivedItsRetentionAndStaleTemporaries) {
  TempDir dir;
  DiskTierOptions options = options_for(dir);
  options.sweep_interval = std::chrono::seconds(0);  // no background sweep in this test
  DiskTier tier(options);
  constexpr uint32_t kAgent = 72 * 3600, kChat = 168 * 3600;
  ASSERT_TRUE(tier.offer(1, 7, tokens_of(1), payload_of(1), kAgent));
  ASSERT_TRUE(tier.offer(2, 7, tokens_of(2), payload_of(2), kChat));
  ASSERT_TRUE(tier.offer(3, 7, tokens_of(3), payload_of(3), 0));  // until space runs out
  tier.flush();
  const auto written = std::filesystem::file_time_type::clock::now();
  std::filesystem::create_directories(block_file_path(dir.path(), 42, 1).parent_path());
  const std::filesystem::path stale =
      block_file_path(dir.path(), 42, 1).parent_path() / "dead-writer.tmp";
  std::ofstream(stale) << "partial";
  std::filesystem::last_write_time(stale, written - std::chrono::hours(2));

  tier.sweep(written + std::chrono::hours(71));
  EXPECT_EQ(tier.stats().expired, 0);
  EXPECT_EQ(tier.stats().stale_temporaries, 1);
  EXPECT_FALSE(std::filesystem::exists(stale));
  // Block 1 is used at hour 71 (a load stamps the file): its 72 hours count from then.
  std::filesystem::last_write_time(block_file_path(dir.path(), 42, 1),
                                   written + std::chrono::hours(71));
  tier.sweep(written + std::chrono::hours(142));
  EXPECT_EQ(tier.stats().expired, 0);
  tier.sweep(written + std::chrono::hours(144));
  EXPECT_EQ(tier.stats().expired, 1);
  EXPECT_FALSE(std::filesystem::exists(block_file_path(dir.path(), 42, 1)));
  EXPECT_TRUE(std::filesystem::exists(block_file_path(dir.path(), 42, 2)));
  tier.sweep(written + std::chrono::hours(169));
  EXPECT_EQ(tier.stats().expired, 2);  // block 2, unused for a week
  EXPECT_FALSE(std::filesystem::exists(block_file_path(dir.path(), 42, 2)));
  tier.sweep(written + std::chrono::hours(24 * 365));
  EXPECT_EQ(tier.stats().expired, 2);  // block 3 stays until space runs out
  EXPECT_TRUE(tier.load(3, 7, tokens_of(3), 512));
}

// A block stored for one request's class and offered again for a longer one keeps the longer
// retention (its file rewritten whole); a shorter one leaves the file alone.
TEST(DiskTier, AStoredBlockKeepsTheLongestRetentionOffered) {
  TempDir dir;
  DiskTier tier(options_for(dir));
  const std::filesystem::path file = block_file_path(dir.path(), 42, 1);
  ASSERT_TRUE(tier.offer(1, 7, tokens_of(1), payload_of(1), 3600));
  tier.flush();
  EXPECT_EQ(block_file_retention(file), 3600u);
  ASSERT_TRUE(tier.offer(1, 7, tokens_of(1), payload_of(1), 60));
  tier.flush();
  EXPECT_EQ(block_file_retention(file), 3600u);
  EXPECT_EQ(tier.stats().retention_extended, 0);
  ASSERT_TRUE(tier.offer(1, 7, tokens_of(1), payload_of(1), 7 * 86400));
  tier.flush();
  EXPECT_EQ(block_file_retention(file), 7u * 86400);
  ASSERT_TRUE(tier.offer(1, 7, tokens_of(1), payload_of(1), 0));
  tier.flush();
  EXPECT_EQ(block_file_retention(file), 0u);
  EXPECT_EQ(tier.stats().retention_extended, 2);
  EXPECT_EQ(tier.stats().written, 1);
  uint32_t kept = 1;
  auto payload = tier.load(1, 7, tokens_of(1), 512, &kept);
  ASSERT_TRUE(payload);
  EXPECT_EQ(*payload, payload_of(1));
  EXPECT_EQ(kept, 0u);
}

TEST(DiskTier, TwoTiersShareOneDirectoryButNotAnotherModelsBlocks) {
  TempDir dir;
  DiskTier writer(options_for(dir));
  DiskTier reader(options_for(dir));
  DiskTierOptions other_model = options_for(dir);
  other_model.fingerprint = 43;
  DiskTier stranger(other_model);
  ASSERT_TRUE(writer.offer(9, 7, tokens_of(4), payload_of(4)));
  writer.flush();
  EXPECT_TRUE(reader.load(9, 7, tokens_of(4), 512));
  EXPECT_FALSE(stranger.load(9, 7, tokens_of(4), 512));
  EXPECT_EQ(stranger.stats().missing, 1);  // its own folder: the other model's file is untouched
  EXPECT_TRUE(reader.load(9, 7, tokens_of(4), 512));
}

}  // namespace
}  // namespace deepinfer
