// N-gram prompt lookup: the longest recurring suffix wins, its latest occurrence proposes.
#include "engine/drafter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

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

// The table answers measured sizes, interpolates between them, extends past the largest
// with the last slope and answers the smallest below it; recent times weigh most.
TEST(StepCosts, InterpolateBetweenMeasuredSizes) {
  StepCosts costs;
  EXPECT_FALSE(costs.known());
  costs.measured(8, 0.002);
  EXPECT_FALSE(costs.known());
  costs.measured(16, 0.003);
  costs.measured(64, 0.009);
  ASSERT_TRUE(costs.known());
  EXPECT_DOUBLE_EQ(costs.seconds(16), 0.003);
  EXPECT_DOUBLE_EQ(costs.seconds(12), 0.0025);
  EXPECT_DOUBLE_EQ(costs.seconds(1), 0.002);
  EXPECT_NEAR(costs.seconds(128), 0.009 + 64 * 0.000125, 1e-12);
  for (int i = 0; i < 50; ++i) costs.observe(16, 0.005);
  EXPECT_NEAR(costs.seconds(16), 0.005, 1e-6);
}

// A larger forward never costs less: a size measured faster than a smaller one answers the
// smaller one's time, so one more token is never free by noise; and one stalled step moves
// its size's time by a bounded share.
TEST(StepCosts, NeverLessForMoreTokensAndRobustToStalls) {
  StepCosts costs;
  costs.measured(1, 0.0011);
  costs.measured(2, 0.0010);
  costs.measured(4, 0.0014);
  costs.measured(8, 0.0020);
  EXPECT_DOUBLE_EQ(costs.seconds(1), 0.0011);
  EXPECT_DOUBLE_EQ(costs.seconds(2), 0.0011);
  EXPECT_DOUBLE_EQ(costs.seconds(3), 0.00125);
  for (int64_t tokens = 1; tokens < 40; ++tokens)
    EXPECT_LE(costs.seconds(tokens), costs.seconds(tokens + 1)) << tokens;
  // Steps of 1 token turn out slower than every size profiled above it: those answer its time.
  for (int i = 0; i < 60; ++i) costs.observe(1, 0.003);
  EXPECT_NEAR(costs.seconds(1), 0.003, 1e-6);
  EXPECT_NEAR(costs.seconds(8), 0.003, 1e-6);
  // One step 100 times slower raises its size by at most 2^0.2.
  const double before = costs.seconds(1);
  costs.observe(1, 0.3);
  EXPECT_LE(costs.seconds(1), before * std::pow(2.0, 0.2) * (1 + 1e-12));
  // So does the first step of a size not measured before: it starts from the table's answer.
  const double three = costs.seconds(3);
  costs.observe(3, 0.3);
  EXPECT_LE(costs.seconds(3), three * std::pow(2.0, 0.2) * (1 + 1e-12));
  EXPECT_GT(costs.seconds(3), three);
}

// However steps of any size move the table, larger sizes never answer less than smaller ones.
TEST(StepCosts, StaysMonotoneUnderRandomSteps) {
  StepCosts costs;
  for (int64_t tokens : {1, 2, 4, 8, 16, 32}) costs.measured(tokens, 0.001 * tokens);
  std::mt19937 random(7);
  std::uniform_int_distribution<int64_t> size(1, 40);
  std::uniform_real_distribution<double> seconds(0.0002, 0.05);
  for (int step = 0; step < 3000; ++step) {
    costs.observe(size(random), seconds(random));
    if (step % 100 != 0) continue;
    for (int64_t tokens = 1; tokens < 48; ++tokens)
      ASSERT_LE(costs.seconds(tokens), costs.seconds(tokens + 1)) << step << " " << tokens;
  }
}

// A step costing 10 ms plus 0.1 ms a token (a large model's decode: weights read once)
// verifies likely drafts generously; one costing 1 ms a token and nothing fixed (a small
// model on a CPU: every token costs the same) verifies none; a step whose time jumps past 8
// tokens (another kernel) takes drafts only up to the jump.
TEST(VerifiedDrafts, FollowTheStepsCostAndTheDraftsChances) {
  StepCosts bandwidth_bound, compute_bound, stepped;
  for (int64_t tokens : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}) {
    const auto n = static_cast<double>(tokens);
    bandwidth_bound.measured(tokens, 0.010 + 0.0001 * n);
    compute_bound.measured(tokens, 0.001 * n);
    stepped.measured(tokens, tokens <= 8 ? 0.001 : 0.004 + 0.0001 * n);
  }
  stepped.measured(9, 0.004);
  const std::vector<DraftOffer> offers = {{5, 0.9, {}}, {5, 0.3, {}}, {0, 0.9, {}}};
  std::vector<int64_t> taken = verified_drafts(offers, 3, 3, bandwidth_bound);
  EXPECT_EQ(taken[0], 5);
  EXPECT_GE(taken[1], 1);
  EXPECT_EQ(taken[2], 0);
  EXPECT_EQ(verified_drafts(offers, 3, 3, compute_bound), (std::vector<int64_t>{0, 0, 0}));
  const std::vector<int64_t> capped = verified_drafts(offers, 3, 3, stepped);
  EXPECT_EQ(capped[0] + capped[1], 5);
  // A large batch leaves little for drafts: one more token's time is worth more rows' tokens.
  const std::vector<int64_t> busy = verified_drafts(offers, 256, 256, bandwidth_bound);
  EXPECT_LT(busy[0] + busy[1], taken[0] + taken[1]);
  // What making a draft costs counts against it.
  StepCosts drafting;  // 10 ms a draft forward, whatever its rows
  drafting.measured(1, 0.010);
  drafting.measured(64, 0.010);
  const std::vector<int64_t> costly = verified_drafts(offers, 3, 3, bandwidth_bound, &drafting);
  EXPECT_LT(costly[0] + costly[1], taken[0] + taken[1]);
  // A request far behind the draft model catches up once for all its later steps: with many
  // left, this step pays only its share.
  StepCosts draft_per_token;  // 0.05 ms a token, 0.2 ms fixed
  for (int64_t tokens : {1, 2, 4, 512, 1024})
    draft_per_token.measured(tokens, 0.0002 + 0.00005 * static_cast<double>(tokens));
  DraftOffer behind{3, 0.9, {}, 1000, 1.0};
  EXPECT_EQ(verified_drafts({behind}, 1, 1, bandwidth_bound, &draft_per_token)[0], 0);
  behind.catch_up_steps = 200.0;
  EXPECT_GT(verified_drafts({behind}, 1, 1, bandwidth_bound, &draft_per_token)[0], 0);
  // Per-draft chances (a draft model's confidence) replace the request's acceptance.
  const std::vector<DraftOffer> confident = {{3, 0.1, {0.95, 0.95, 0.01}}};
  EXPECT_EQ(verified_drafts(confident, 1, 1, bandwidth_bound)[0], 2);
}

TEST(AcceptanceModel, PoolsRequestsAndKeepsEachOnesOwnRate) {
  AcceptanceModel model(0.6);
  const AcceptanceTrials fresh;
  EXPECT_DOUBLE_EQ(model.chance(fresh), 0.6);
  // Two steps of 32 requests whose first draft is rejected: every request, a new one
  // included, now expects little of its drafts.
  std::vector<AcceptanceTrials> batch(32);
  for (int step = 0; step < 2; ++step)
    for (AcceptanceTrials& own : batch) model.observe(own, 0, 5);
  EXPECT_LT(model.chance(fresh), 0.2);
  EXPECT_LT(model.chance(batch[0]), model.chance(fresh));
  // One rejection alone does not end a drafter's chances.
  AcceptanceModel single(0.6);
  AcceptanceTrials unlucky;
  single.observe(unlucky, 0, 5);
  EXPECT_GT(single.chance(unlucky), 0.45);
  // A request whose drafts keep being accepted earns its own rate against the pooled one.
  AcceptanceTrials agreeing;
  for (int step = 0; step < 20; ++step) model.observe(agreeing, 5, 5);
  EXPECT_GT(model.chance(agreeing), 0.8);
  EXPECT_LT(model.chance(agreeing), 1.0);
  // All five kept is five trials; two kept of five is three (the third was rejected).
  AcceptanceTrials partial;
  AcceptanceModel even(0.5);
  even.observe(partial, 2, 5);
  EXPECT_DOUBLE_EQ(partial.trials, 3.0);
  EXPECT_DOUBLE_EQ(partial.accepted, 2.0);
  even.observe(partial, 0, 0);  // nothing verified: nothing learnt
  EXPECT_DOUBLE_EQ(partial.trials, 3.0);
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
