// The block pool's prefix caching: chained keys, LRU reuse, salts, and a prefix hit giving the
// logits of a cold run on real fixture models.
#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;
using testing::max_abs_difference;

TEST(BlockPool, KeysChainThroughParentsAndSalts) {
  std::vector<int32_t> tokens = {1, 2, 3, 4};
  BlockHash plain = block_hash(0, tokens, 0);
  EXPECT_EQ(plain, block_hash(0, tokens, 0));
  EXPECT_NE(plain, block_hash(plain, tokens, 0));  // same tokens, different prefix
  EXPECT_NE(plain, block_hash(0, tokens, 7));      // another tenant
  std::vector<int32_t> other = {1, 2, 3, 5};
  EXPECT_NE(plain, block_hash(0, other, 0));
}

TEST(BlockPool, IdleBlocksStayFindableUntilReusedLeastRecentFirst) {
  BlockPool pool(4);  // null block + 3
  EXPECT_EQ(pool.available(), 3);
  std::vector<int32_t> content = {9, 9};
  int32_t a = pool.allocate(), b = pool.allocate();
  EXPECT_NE(a, BlockPool::kNullBlock);
  pool.publish(a, 11, content);
  pool.release(a);
  pool.release(b);
  // a is idle but cached: a lookup takes it back.
  EXPECT_EQ(pool.take_cached(11, content), a);
  EXPECT_EQ(pool.references(a), 1);
  std::vector<int32_t> different = {9, 8};
  EXPECT_EQ(pool.take_cached(11, different), -1);  // same key, other tokens: a miss
  pool.release(a);
  // Idle order is now: never-used block, b, a. Allocating three evicts a's content last.
  int32_t first = pool.allocate();
  int32_t second = pool.allocate();
  EXPECT_NE(first, a);
  EXPECT_EQ(second, b);
  EXPECT_EQ(pool.take_cached(11, content), a);  // still there
  pool.release(a);
  EXPECT_EQ(pool.allocate(), a);                 // reused for new content...
  EXPECT_EQ(pool.take_cached(11, content), -1);  // ...so its old content is gone
  EXPECT_EQ(pool.allocate(), -1);
  EXPECT_EQ(pool.find_cached(11, content), -1);
}

// A block's lower-tier retention is the longest its requests asked for; a longer wish than it
// was persisted with makes it due for offering again, a shorter one does not.
TEST(BlockPool, TheLongestRetentionAskedForWins) {
  BlockPool pool(3);
  std::vector<int32_t> content = {1, 2};
  int32_t block = pool.allocate();
  pool.publish(block, 5, content);
  EXPECT_FALSE(pool.retention_of(block));
  pool.want_retention(block, 3600);
  pool.mark_persisted(block, 3600);
  EXPECT_TRUE(pool.is_persisted(block));
  pool.want_retention(block, 60);
  EXPECT_TRUE(pool.is_persisted(block));
  EXPECT_EQ(pool.retention_of(block), 3600u);
  pool.want_retention(block, 7200);
  EXPECT_FALSE(pool.is_persisted(block));
  EXPECT_EQ(pool.retention_of(block), 7200u);
  pool.mark_persisted(block, 7200);
  pool.want_retention(block, 0);  // no expiry outlasts any
  EXPECT_FALSE(pool.is_persisted(block));
  EXPECT_EQ(pool.retention_of(block), 0u);
  pool.mark_persisted(block, 0);
  pool.want_retention(block, 1u << 30);
  EXPECT_TRUE(pool.is_persisted(block));
  // Installed from a lower tier with the file's retention: a wish within it changes nothing.
  int32_t installed = pool.allocate();
  pool.publish(installed, 6, std::vector<int32_t>{3, 4});
  pool.mark_persisted(installed, 600);
  pool.want_retention(installed, 600);
  EXPECT_TRUE(pool.is_persisted(installed));
  pool.release(block);
  pool.release(installed);
  // New content forgets the old block's retention.
  while (pool.allocate() >= 0) {
  }
  EXPECT_FALSE(pool.retention_of(block));
}

// Runs `tokens[cached:]` after the cache already holds `cached` tokens; the last row's logits.
std::vector<float> run(CausalLM& model, KvCache& cache, SequenceKv& blocks,
                       const std::vector<int32_t>& tokens, int64_t cached) {
  blocks.reserve(cache, static_cast<int64_t>(tokens.size()));
  ForwardBatch batch;
  batch.add_sequence(std::vector<int32_t>(tokens.begin() + cached, tokens.end()), cached, blocks,
                     cache.shape().block_size, false);
  std::vector<float> logits(static_cast<size_t>(model.config().vocab_size));
  model.forward(batch, cache, logits.data());
  return logits;
}

TEST(PrefixCache, HitGivesTheLogitsOfAColdRunAndSaltsIsolate) {
  for (const char* name :
       {"llama-gqa", "qwen3-qknorm", "deepseek-v3-mla-moe", "qwen3-hybrid-swa", "mistral-swa"}) {
    auto ops = make_cpu_ops();
    auto model = load_model(fixture_model(name), LoadMode::kMmap, *ops);
    std::vector<int32_t> first;
    for (int32_t i = 0; i < 30; ++i) first.push_back((i * 37 + 11) % model->config().vocab_size);
    const int block_size = 4;
    KvCache cache(model->kv_shape(block_size), 64);
    SequenceKv a;
    run(*model, cache, a, first, 0);
    a.publish_full_blocks(cache, first, static_cast<int64_t>(first.size()), 0);
    a.release_all(cache);

    // Shares the first 17 tokens, then goes its own way.
    std::vector<int32_t> second(first.begin(), first.begin() + 17);
    for (int32_t token : {5, 6, 7, 8, 9}) second.push_back(token);
    SequenceKv warm;
    int64_t cached = warm.take_cached_prefix(cache, second, 0);
    EXPECT_EQ(cached, 16) << name;  // four whole blocks
    std::vector<float> hit = run(*model, cache, warm, second, cached);

    KvCache fresh(model->kv_shape(block_size), 64);
    SequenceKv cold;
    std::vector<float> expected = run(*model, fresh, cold, second, 0);
    EXPECT_LE(max_abs_difference(hit.data(), expected.data(), hit.size()), 1e-4f) << name;

    SequenceKv salted;
    EXPECT_EQ(salted.take_cached_prefix(cache, second, 42), 0) << name;
    // A prompt that is all cached blocks still leaves its last token to compute.
    SequenceKv exact;
    std::vector<int32_t> sixteen(first.begin(), first.begin() + 16);
    EXPECT_EQ(exact.take_cached_prefix(cache, sixteen, 0), 12) << name;
  }
}

TEST(KvGroups, LayersGroupByWindowIntoEqualPages) {
  KvGroupLayout alternating = KvGroupLayout::of({8, 0, 8, 0}, 4);
  EXPECT_EQ(alternating.layers_per_page, 2);
  EXPECT_EQ(alternating.group_window, (std::vector<int>{8, 0}));
  EXPECT_EQ(alternating.layer_group, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(alternating.layer_slot, (std::vector<int>{0, 0, 1, 1}));
  // Three sliding layers and one full one: pages of gcd(3, 1) = 1 layer, four groups.
  KvGroupLayout five_to_one = KvGroupLayout::of({4, 4, 4, 0}, 4);
  EXPECT_EQ(five_to_one.layers_per_page, 1);
  EXPECT_EQ(five_to_one.group_window, (std::vector<int>{4, 4, 4, 0}));
  KvGroupLayout plain = KvGroupLayout::of({}, 3);
  EXPECT_EQ(plain.num_groups(), 1);
  EXPECT_EQ(plain.layers_per_page, 3);
}

// A sliding group needs only its window's blocks for a prefix hit: blocks that left the
// window may be evicted, the window's may not.
TEST(KvGroups, SlidingGroupsHitWithOnlyTheirWindowCached) {
  KvCacheShape shape = KvCacheShape::heads(4, 1, 8, 4);
  shape.layer_window = {8, 0, 8, 0};
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 29; ++i) tokens.push_back(i * 3 + 1);
  std::span<const int32_t> first28(tokens.data(), 28);
  KvCache cache(shape, 15);  // the null block + 7 blocks in each of the two groups
  SequenceKv a;
  a.reserve(cache, 28);
  EXPECT_EQ(cache.free_blocks(), 0);
  a.publish_full_blocks(cache, first28, 28, 0);
  a.release_out_of_window(cache, 28);  // sliding blocks 0..4 left the window: idle first
  EXPECT_EQ(cache.free_blocks(), 5);
  a.release_all(cache);
  std::vector<int32_t> evicted;
  for (int i = 0; i < 5; ++i) evicted.push_back(cache.allocate());  // takes those five
  SequenceKv b;
  EXPECT_EQ(b.take_cached_prefix(cache, tokens, 0), 28);
  EXPECT_EQ(b.group(0).table()[0], BlockPool::kNullBlock);  // out of the window: not needed
  EXPECT_NE(b.group(0).table()[5], BlockPool::kNullBlock);
  b.release_all(cache);
  for (int32_t block : evicted) cache.release(block);
  // Now evict everything: without the window's blocks there is no hit at all.
  while (cache.allocate() >= 0) {
  }
  SequenceKv c;
  EXPECT_EQ(c.take_cached_prefix(cache, tokens, 0), 0);
}

}  // namespace
}  // namespace deepinfer
