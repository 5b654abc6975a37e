// N-gram prompt lookup: the longest recurring suffix wins, its latest occurrence proposes.
#include "engine/drafter.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace deepinfer {
namespace {

TEST(NgramDrafts, TheLongestRecurringSuffixProposesWhatFollowedItLast) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3};
  // [1, 2, 3] recurs at 0 (followed by 4, 9, 2); [2, 3] alone would pick its latest, at 5.
  EXPECT_EQ(ngram_drafts(tokens, 1, 4, 3), (std::vector<int32_t>{4, 9, 2}));
  EXPECT_EQ(ngram_drafts(tokens, 1, 2, 3), (std::vector<int32_t>{5, 1, 2}));
  EXPECT_EQ(ngram_drafts(tokens, 1, 4, 1), (std::vector<int32_t>{4}));
  // Fewer tokens follow the occurrence than asked for.
  EXPECT_EQ(ngram_drafts(std::vector<int32_t>{6, 7, 8, 6, 7}, 1, 4, 5),
            (std::vector<int32_t>{8, 6, 7}));
  // A run overlaps itself.
  EXPECT_EQ(ngram_drafts(std::vector<int32_t>{4, 7, 7, 7}, 1, 4, 5), (std::vector<int32_t>{7}));
}

TEST(NgramDrafts, NothingWithoutARecurrenceOrRoom) {
  EXPECT_TRUE(ngram_drafts(std::vector<int32_t>{1, 2, 3, 4}, 1, 4, 5).empty());
  EXPECT_TRUE(ngram_drafts(std::vector<int32_t>{1, 2, 1, 2}, 1, 4, 0).empty());
  EXPECT_TRUE(ngram_drafts(std::vector<int32_t>{5}, 1, 4, 5).empty());
  EXPECT_TRUE(ngram_drafts(std::vector<int32_t>{}, 1, 4, 5).empty());
  // Only suffixes of at least min_n tokens count.
  EXPECT_TRUE(ngram_drafts(std::vector<int32_t>{1, 2, 3, 9, 3}, 2, 4, 5).empty());
}

// A step costing 10 ms plus 0.1 ms a token (a large model's decode: weights read once)
// verifies likely drafts generously; one costing 1 ms a token and nothing fixed (a small
// model on a CPU: every token costs the same) verifies none.
TEST(VerifiedDrafts, FollowTheStepsCostAndTheDraftsChances) {
  StepCosts bandwidth_bound, compute_bound;
  EXPECT_FALSE(bandwidth_bound.known());
  for (int64_t tokens : {1, 8, 64, 4, 16, 2, 32, 1}) {
    bandwidth_bound.observe(tokens, 0.010 + 0.0001 * static_cast<double>(tokens));
    compute_bound.observe(tokens, 0.001 * static_cast<double>(tokens));
  }
  ASSERT_TRUE(bandwidth_bound.known());
  EXPECT_NEAR(bandwidth_bound.fixed_seconds(), 0.010, 1e-9);
  EXPECT_NEAR(bandwidth_bound.seconds_per_token(), 0.0001, 1e-9);
  const std::vector<DraftOffer> offers = {{5, 0.9, {}}, {5, 0.3, {}}, {0, 0.9, {}}};
  std::vector<int64_t> taken = verified_drafts(offers, 3, 3, bandwidth_bound);
  EXPECT_EQ(taken[0], 5);
  EXPECT_GE(taken[1], 1);
  EXPECT_EQ(taken[2], 0);
  EXPECT_EQ(verified_drafts(offers, 3, 3, compute_bound), (std::vector<int64_t>{0, 0, 0}));
  // A large batch leaves little for drafts: one more token's time is worth more rows' tokens.
  const std::vector<int64_t> busy = verified_drafts(offers, 256, 256, bandwidth_bound);
  EXPECT_LT(busy[0] + busy[1], taken[0] + taken[1]);
}

TEST(SpeculativeConfig, RefusesWhatItCannotRun) {
  SpeculativeConfig config;
  config.validate();  // off
  config.method = "eagle";
  EXPECT_THROW(config.validate(), Error);
  config.method = "ngram";
  config.validate();
  config.prompt_lookup_min = 5;
  EXPECT_THROW(config.validate(), Error);
  config.prompt_lookup_min = 1;
  config.num_speculative_tokens = 65;
  EXPECT_THROW(config.validate(), Error);
}

}  // namespace
}  // namespace deepinfer
