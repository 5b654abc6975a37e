// The host-memory tier: a byte budget with least-recently-used eviction, and blocks served only
// under the tokens and salt they were stored with.
#include "kv/host_tier.h"

#include <gtest/gtest.h>

namespace deepinfer {
namespace {

std::vector<std::byte> payload_of(int block) {
  return std::vector<std::byte>(100, static_cast<std::byte>(block));
}

TEST(HostTier, KeepsTheMostRecentlyUsedWithinItsBudget) {
  HostTier tier(300);
  for (int b = 1; b <= 3; ++b) tier.put(b, 7, {b, b}, payload_of(b));
  ASSERT_TRUE(tier.get(1, 7, std::vector<int32_t>{1, 1}));  // block 1 is used again
  tier.put(4, 7, {4, 4}, payload_of(4));                    // so block 2 goes
  EXPECT_TRUE(tier.contains(1));
  EXPECT_FALSE(tier.contains(2));
  EXPECT_TRUE(tier.contains(3));
  EXPECT_TRUE(tier.contains(4));
  EXPECT_EQ(tier.stats().evicted, 1);
  EXPECT_EQ(tier.stats().bytes, 300u);
  auto payload = tier.get(4, 7, std::vector<int32_t>{4, 4});
  ASSERT_TRUE(payload);
  EXPECT_EQ(*payload, payload_of(4));
}

TEST(HostTier, ServesABlockOnlyUnderItsTokensAndSalt) {
  HostTier tier(1000);
  tier.put(9, 7, {1, 2}, payload_of(9));
  EXPECT_FALSE(tier.get(9, 8, std::vector<int32_t>{1, 2}));  // another tenant's salt
  EXPECT_FALSE(tier.get(9, 7, std::vector<int32_t>{1, 3}));  // a key collision
  EXPECT_TRUE(tier.get(9, 7, std::vector<int32_t>{1, 2}));
  EXPECT_EQ(tier.stats().loaded, 1);
}

TEST(HostTier, ABlockLargerThanTheBudgetIsNotKept) {
  HostTier tier(50);
  tier.put(1, 7, {1}, payload_of(1));
  EXPECT_FALSE(tier.contains(1));
  EXPECT_EQ(tier.stats().bytes, 0u);
}

}  // namespace
}  // namespace deepinfer
