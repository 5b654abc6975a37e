// The router's policies: prefill by estimated compute with cache affinity, decode by load,
// health checks with back-off.
#include "router/routing.h"

#include <gtest/gtest.h>

namespace deepinfer::router {
namespace {

// Chained keys of `blocks` blocks of a prompt that starts with `shared` blocks in common with
// every other prompt of the same `family`.
PrefixKeys keys_of(uint64_t family, int shared, uint64_t unique, int blocks) {
  PrefixKeys keys;
  uint64_t chain = family * 1000003;
  for (int i = 0; i < blocks; ++i) {
    chain = chain * 31 + (i < shared ? static_cast<uint64_t>(i) : unique * 7919 + i);
    keys.push_back(chain);
  }
  return keys;
}

Registry::Options options() {
  Registry::Options options;
  options.block_size = 16;
  options.cost = {1e-4, 1e-8};
  return options;
}

TEST(Roles, ParseAsServeSpellsThem) {
  EXPECT_EQ(parse_role("prefill"), Role::kPrefill);
  EXPECT_EQ(parse_role("decode"), Role::kDecode);
  EXPECT_EQ(parse_role("both"), Role::kBoth);
  EXPECT_FALSE(parse_role("Prefill").has_value());
}

TEST(PrefillCost, CountsTheContextEachComputedTokenAttendsOver) {
  const PrefillCost cost{1e-4, 1e-8};
  EXPECT_DOUBLE_EQ(cost.seconds(0, 0), 0.0);
  EXPECT_DOUBLE_EQ(cost.seconds(0, 1), 1e-4);
  // 100 tokens after 1,000 cached: each attends over 1,000 + its place.
  EXPECT_NEAR(cost.seconds(1000, 100), 100 * 1e-4 + 100 * (1000 + 49.5) * 1e-8, 1e-12);
  EXPECT_LT(cost.seconds(1000, 100), cost.seconds(0, 1100));
}

TEST(PrefixIndex, MatchesLeadingKeysAndEvictsTheLeastRecentlyUsed) {
  PrefixIndex index(6);
  const PrefixKeys a = keys_of(1, 4, 1, 4), b = keys_of(1, 2, 2, 4);
  index.insert(a);
  EXPECT_EQ(index.matched(a), 4);
  EXPECT_EQ(index.matched(b), 2);  // shares its first two blocks
  EXPECT_EQ(index.matched(keys_of(2, 4, 1, 4)), 0);
  index.insert(b);  // 4 + 2 new keys: at capacity
  EXPECT_EQ(index.size(), 6u);
  // Three new keys evict the three least recently used: a's tail and b's last block; the
  // shared head, used by both, stays.
  index.insert(keys_of(3, 3, 3, 3));
  EXPECT_EQ(index.size(), 6u);
  EXPECT_EQ(index.matched(b), 3);
  EXPECT_EQ(index.matched(a), 2);
  EXPECT_EQ(index.matched(keys_of(3, 3, 3, 3)), 3);
}

TEST(Registry, PrefillGoesWhereThePrefixIsCachedUnlessThatWorkerIsBusy) {
  Registry registry(options());
  const size_t first = registry.add("http://a", Role::kPrefill);
  const size_t second = registry.add("http://b", Role::kPrefill);
  registry.add("http://c", Role::kDecode);
  const PrefixKeys agent = keys_of(7, 256, 1, 257);  // a 4,096-token shared context
  const auto cold = registry.route_prefill(agent, 257 * 16);
  ASSERT_TRUE(cold.has_value());
  EXPECT_EQ(cold->cached_tokens, 0);
  const size_t holder = cold->worker;
  registry.reported(holder, {});  // the prefill is done: its queue is empty again
  // The same agent returns with a new turn: the holder has 4,096 of its tokens.
  const auto warm = registry.route_prefill(keys_of(7, 256, 2, 260), 260 * 16);
  ASSERT_TRUE(warm.has_value());
  EXPECT_EQ(warm->worker, holder);
  EXPECT_EQ(warm->cached_tokens, 256 * 16);
  // Once the holder is far behind, the other worker's cold prefill is sooner.
  registry.reported(holder, {200000, 0, 0, 0});
  const auto busy = registry.route_prefill(keys_of(7, 256, 3, 260), 260 * 16);
  ASSERT_TRUE(busy.has_value());
  EXPECT_EQ(busy->worker, holder == first ? second : first);
  EXPECT_EQ(busy->cached_tokens, 0);
  // Routed work counts until the next report: two cold prompts in a row spread out.
  Registry spread(options());
  spread.add("http://a", Role::kBoth);
  spread.add("http://b", Role::kBoth);
  const auto one = spread.route_prefill(keys_of(1, 0, 1, 64), 1024);
  const auto two = spread.route_prefill(keys_of(2, 0, 2, 64), 1024);
  ASSERT_TRUE(one && two);
  EXPECT_NE(one->worker, two->worker);
}

TEST(Registry, TheLastPromptTokenIsAlwaysComputed) {
  Registry registry(options());
  registry.add("http://a", Role::kBoth);
  const PrefixKeys keys = keys_of(1, 2, 1, 2);
  registry.route_prefill(keys, 32);
  const auto again = registry.route_prefill(keys, 32);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->cached_tokens, 31);
}

TEST(Registry, DecodeGoesWhereTheKvHasRoomAndTheLoadIsLeast) {
  Registry registry(options());
  const size_t small = registry.add("http://a", Role::kDecode);
  const size_t large = registry.add("http://b", Role::kDecode);
  const size_t prefill = registry.add("http://c", Role::kPrefill);
  registry.reported(small, {0, 2, 90, 100});
  registry.reported(large, {0, 1, 500, 1000});
  registry.reported(prefill, {0, 0, 1000, 1000});
  EXPECT_EQ(registry.route_decode(1000), small);  // 90% free
  // A request that needs more blocks than the freest share holds goes where it fits.
  EXPECT_EQ(registry.route_decode(100 * 16), large);
  // Equal shares: the fewer running sequences.
  registry.reported(small, {0, 9, 50, 100});
  registry.reported(large, {0, 3, 500, 1000});
  EXPECT_EQ(registry.route_decode(16), large);
}

TEST(Registry, FailedWorkersLeaveRoutingAndComeBackWithoutTheirCache) {
  Registry registry(options());
  const size_t only = registry.add("http://a", Role::kBoth);
  const PrefixKeys keys = keys_of(1, 8, 1, 8);
  registry.route_prefill(keys, 128);
  registry.checked(only, false, 100.0);
  EXPECT_FALSE(registry.route_prefill(keys, 128).has_value());
  EXPECT_FALSE(registry.route_decode(16).has_value());
  EXPECT_TRUE(registry.due_for_retry(100.5).empty());
  EXPECT_EQ(registry.due_for_retry(101.0), std::vector<size_t>{only});
  registry.checked(only, false, 101.0);  // backs off: 2 s
  EXPECT_TRUE(registry.due_for_retry(102.5).empty());
  EXPECT_EQ(registry.due_for_retry(103.0).size(), 1u);
  for (int i = 0; i < 20; ++i) registry.checked(only, false, 200.0);
  EXPECT_DOUBLE_EQ(registry.workers()[only].retry_at, 230.0);  // at most the longest wait
  registry.checked(only, true, 230.0);
  const auto back = registry.route_prefill(keys, 128);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->cached_tokens, 0);
}

}  // namespace
}  // namespace deepinfer::router
