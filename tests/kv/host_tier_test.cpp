// The host-memory tier: fixed-size slots within a byte budget, least-recently-used eviction,
// slots that stay with their readers, and blocks served only under the tokens and salt they
// were stored with.
#include "kv/host_tier.h"

#include <gtest/gtest.h>

#include <cstring>

namespace deepinfer {
namespace {

constexpr size_t kBlockBytes = 100;

// Stores block `key` (every byte equal to it) through a reserved slot; false when none was
// free.
bool store(HostTier& tier, BlockHash key, std::vector<int32_t> tokens) {
  std::shared_ptr<std::byte> slot = tier.reserve();
  if (!slot) return false;
  std::memset(slot.get(), static_cast<int>(key), kBlockBytes);
  tier.put(key, 7, std::move(tokens), std::move(slot));
  return true;
}

bool holds_bytes_of(const std::shared_ptr<const std::byte>& payload, BlockHash key) {
  for (size_t i = 0; i < kBlockBytes; ++i)
    if (payload.get()[i] != static_cast<std::byte>(key)) return false;
  return true;
}

TEST(HostTier, KeepsTheMostRecentlyUsedWithinItsBudget) {
  HostTier tier(300, kBlockBytes);
  for (int b = 1; b <= 3; ++b) ASSERT_TRUE(store(tier, b, {b, b}));
  ASSERT_TRUE(tier.get(1, 7, std::vector<int32_t>{1, 1}));  // block 1 is used again
  ASSERT_TRUE(store(tier, 4, {4, 4}));                      // so block 2 goes
  EXPECT_TRUE(tier.contains(1));
  EXPECT_FALSE(tier.contains(2));
  EXPECT_TRUE(tier.contains(3));
  EXPECT_TRUE(tier.contains(4));
  EXPECT_EQ(tier.stats().evicted, 1);
  EXPECT_EQ(tier.stats().bytes, 300u);
  auto payload = tier.get(4, 7, std::vector<int32_t>{4, 4});
  ASSERT_TRUE(payload);
  EXPECT_TRUE(holds_bytes_of(payload, 4));
  EXPECT_TRUE(holds_bytes_of(tier.get(1, 7, std::vector<int32_t>{1, 1}), 1));
}

TEST(HostTier, ServesABlockOnlyUnderItsTokensAndSalt) {
  HostTier tier(1000, kBlockBytes);
  ASSERT_TRUE(store(tier, 9, {1, 2}));
  EXPECT_FALSE(tier.get(9, 8, std::vector<int32_t>{1, 2}));  // another tenant's salt
  EXPECT_FALSE(tier.get(9, 7, std::vector<int32_t>{1, 3}));  // a key collision
  EXPECT_TRUE(tier.get(9, 7, std::vector<int32_t>{1, 2}));
  EXPECT_EQ(tier.stats().loaded, 1);
}

TEST(HostTier, ABlockLargerThanTheBudgetIsNotKept) {
  HostTier tier(50, kBlockBytes);
  EXPECT_FALSE(store(tier, 1, {1}));
  EXPECT_FALSE(tier.contains(1));
  EXPECT_EQ(tier.stats().bytes, 0u);
}

// A reader keeps its block's slot: evicted, the block leaves the tier, but its bytes stay
// intact and the slot is not handed out again until the reader lets go.
TEST(HostTier, ASlotBeingReadIsNotReused) {
  HostTier tier(kBlockBytes, kBlockBytes);
  ASSERT_TRUE(store(tier, 1, {1}));
  std::shared_ptr<const std::byte> reading = tier.get(1, 7, std::vector<int32_t>{1});
  ASSERT_TRUE(reading);
  EXPECT_FALSE(store(tier, 2, {2}));  // evicts block 1, whose slot is still being read
  EXPECT_FALSE(tier.contains(1));
  EXPECT_TRUE(holds_bytes_of(reading, 1));
  reading.reset();
  EXPECT_TRUE(store(tier, 2, {2}));
  EXPECT_TRUE(holds_bytes_of(tier.get(2, 7, std::vector<int32_t>{2}), 2));
}

// Memory comes from the backend's allocator in large chunks, only once blocks arrive, and a
// refusal (the host would not lock more) leaves the tier at the size it reached.
TEST(HostTier, TakesMemoryInChunksAsItFills) {
  int chunks = 0;
  bool refuse = false;
  HostTier tier(1000, kBlockBytes, [&](size_t bytes) {
    if (refuse) throw std::runtime_error("no more page-locked memory");
    ++chunks;
    return host_memory(bytes);
  });
  EXPECT_EQ(chunks, 0);
  for (int b = 1; b <= 10; ++b) ASSERT_TRUE(store(tier, b, {b}));
  EXPECT_EQ(chunks, 1);  // one chunk holds the whole budget of ten blocks
  EXPECT_EQ(tier.stats().bytes, 1000u);

  HostTier refused(1000, kBlockBytes, [&](size_t) -> BackendMemory {
    throw std::runtime_error("no more page-locked memory");
  });
  EXPECT_FALSE(store(refused, 1, {1}));
  refuse = true;
  EXPECT_TRUE(store(tier, 11, {11}));  // the full tier reuses its oldest slot
  EXPECT_FALSE(tier.contains(1));
}

}  // namespace
}  // namespace deepinfer
