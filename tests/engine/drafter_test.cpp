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
